"""The control endpoint's loopback port when ``bind(127.0.0.1:0)`` finds none free (seed
004 V1.1 §2: "正常启动先使用 bind(127.0.0.1:0)；Linux 仅在该调用因 AddrInUse 失败后，才读取并严格解析
ip_local_port_range、ip_unprivileged_port_start 与 ip_local_reserved_ports。候选限定在 61000-65535 高位段，
排除当前临时范围、低于实际非特权起点和显式 reserved ranges，再按当前 boot 随机化起点并跳过已占用端口。任一
sysctl 缺失/非法、候选耗尽或出现非占用类错误必须失败关闭")."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.mailbox.port_fallback import FallbackError, candidates, read_candidates
from tests.harness import running


def _sysctl(tmp_path: Path, ephemeral: str, start: str, reserved: str) -> Path:
    for name, text in (
        ("ip_local_port_range", ephemeral),
        ("ip_unprivileged_port_start", start),
        ("ip_local_reserved_ports", reserved),
    ):
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_candidates_are_the_high_ports_outside_every_range_from_a_boots_own_start(tmp_path: Path) -> None:
    ports = read_candidates(_sysctl(tmp_path, "32768\t62999\n", "1024\n", "63000-63009,64000\n"), seed=0)
    assert set(ports) == set(range(61000, 65536)) - set(range(61000, 63000)) - set(range(63000, 63010)) - {64000}
    assert ports == sorted(ports)
    other = read_candidates(tmp_path, seed=7)
    assert other == [*ports[7:], *ports[:7]], "another boot starts elsewhere and covers the same ports"
    # An unprivileged start above the high range leaves nothing: fail closed.
    with pytest.raises(FallbackError, match="no candidate"):
        read_candidates(_sysctl(tmp_path, "32768 60999", "65536", ""), seed=0)
    assert candidates((32768, 60999), 1024, [], seed=0)[:2] == [61000, 61001]


@pytest.mark.parametrize(
    ("ephemeral", "start", "reserved"),
    [
        ("32768", "1024", ""),  # one number
        ("32768 60999 1", "1024", ""),
        ("60999 32768", "1024", ""),  # backwards
        ("32768 60999", "-1", ""),
        ("32768 60999", "1024", "63000-62000"),
        ("32768 60999", "1024", "63000,,63001"),
        ("32768 60999", "1024", "7000x"),
        ("32768 70000", "1024", ""),
    ],
)
def test_a_sysctl_that_does_not_parse_strictly_fails_closed(
    tmp_path: Path, ephemeral: str, start: str, reserved: str
) -> None:
    with pytest.raises(FallbackError):
        read_candidates(_sysctl(tmp_path, ephemeral, start, reserved), seed=0)


def test_a_missing_sysctl_fails_closed(tmp_path: Path) -> None:
    (tmp_path / "ip_local_port_range").write_text("32768 60999\n")
    with pytest.raises(FallbackError, match="ip_unprivileged_port_start"):
        read_candidates(tmp_path, seed=0)


def test_a_supervisor_whose_port_zero_bind_is_refused_listens_on_a_high_port(short_tmp: Path) -> None:
    """Live: ``control.bind-any=raise`` stands for a kernel with no free ephemeral port."""
    from tests.test_supervision import all_running, spec

    text = '[supervisor]\ntransport = "tcp"\n' + spec()
    with running(short_tmp / "h", text, env={"CORRAL_FAILPOINTS": "control.bind-any=raise"}) as daemon:
        control = daemon.endpoint.control
        assert control.startswith("tcp://127.0.0.1:")
        port = int(control.rsplit(":", 1)[1])
        assert port in read_candidates(Path("/proc/sys/net/ipv4"), seed=0), port
        daemon.wait_until(all_running)
        assert daemon.call("request_actor", actor_id="w-1", body={"x": 1})["echo"] == {"x": 1}
