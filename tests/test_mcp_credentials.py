"""Seed 004 V1.22: "项目配置、.env 和宿主环境变量不作为凭据回退" (no credential falls back to
the project's configuration, a .env file or the host's environment). A ``${NAME}``
in an MCP server's ``env`` or ``headers`` value is read only from the user's private
credentials file, which must be a regular file of mode 0600."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.core.mcp_credentials import CredentialsError, credentials_file, expand_credentials, read_credentials
from corral.supervisor.spec.swarm_spec import parse_spec


def _write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_file_lives_in_the_users_config_directory() -> None:
    assert credentials_file({"XDG_CONFIG_HOME": "/cfg", "HOME": "/h"}) == Path("/cfg/corral/mcp-credentials.toml")
    assert credentials_file({"HOME": "/h"}) == Path("/h/.config/corral/mcp-credentials.toml")
    # A relative XDG_CONFIG_HOME is invalid by the XDG spec: ignored.
    assert credentials_file({"XDG_CONFIG_HOME": "rel", "HOME": "/h"}) == Path("/h/.config/corral/mcp-credentials.toml")


def test_a_name_is_read_from_the_file_and_never_from_the_host_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "mcp-credentials.toml", 'WEB_TOKEN = "from-the-file"\n')
    monkeypatch.setenv("WEB_TOKEN", "from-the-host")
    monkeypatch.setenv("ONLY_IN_HOST", "host-value")
    credentials = read_credentials(path)
    assert expand_credentials("Bearer ${WEB_TOKEN}", credentials, path) == "Bearer from-the-file"
    with pytest.raises(CredentialsError) as caught:
        expand_credentials("Bearer ${ONLY_IN_HOST}", credentials, path)
    message = str(caught.value)
    assert "ONLY_IN_HOST" in message and str(path) in message
    assert "host-value" not in message


def test_a_missing_file_names_the_file_and_the_name(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "mcp-credentials.toml"
    credentials = read_credentials(path)
    with pytest.raises(CredentialsError) as caught:
        expand_credentials("${TOKEN}", credentials, path)
    assert "TOKEN" in str(caught.value) and str(path) in str(caught.value)
    assert "does not exist" in str(caught.value)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_file_readable_by_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = _write(tmp_path / "mcp-credentials.toml", 'TOKEN = "secret-value"\n', mode)
    with pytest.raises(CredentialsError) as caught:
        read_credentials(path)
    assert "chmod 600" in str(caught.value) and "secret-value" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("TOKEN = 1\n", "must be a string"),
        ("[TOKEN]\nx = 'y'\n", "must be a string"),
        ("TOKEN = \n", "not valid TOML"),
    ],
)
def test_a_malformed_file_is_refused_without_its_content(tmp_path: Path, text: str, words: str) -> None:
    path = _write(tmp_path / "mcp-credentials.toml", text)
    with pytest.raises(CredentialsError, match=words):
        read_credentials(path)


def test_the_actor_gets_no_host_variable_and_only_the_files_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", "/private/cfg")
    spec = parse_spec(
        {
            "mcp_servers": [
                {"id": "web", "url": "https://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${WEB_TOKEN}"}}
            ]
        }
    )
    actor = spec.actor("mcp-web")
    assert actor.env_passthrough == ()
    assert actor.params["server"]["headers"] == {"Authorization": "Bearer ${WEB_TOKEN}"}
    assert actor.params["server"]["credentials_file"] == "/private/cfg/corral/mcp-credentials.toml"
