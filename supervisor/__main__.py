"""``python -m corral.supervisor``: the daemon process itself (``corral up`` starts it)."""

from __future__ import annotations

import gc

# The imports below build ~0.4 s of classes and schemas that live as long as the
# process: the collector would scan them again and again meanwhile (about a tenth
# of the boot's CPU, measured). It runs again, over what the boot leaves after
# freezing it, once the supervisor is built (main()).
gc.disable()

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import trio  # noqa: E402

from corral.actors.runtime import PRELOAD_ENV, preload_plan  # noqa: E402
from corral.actors.user_code import TOOL_MODULES_ENV  # noqa: E402
from corral.actors.user_code_pins import USER_CODE_ENV, UserCodeRecord, freeze, install  # noqa: E402
from corral.core.child_python import USER_PATH_ENV, drop_working_directory  # noqa: E402
from corral.core.errors import CorralError, UserCodeError  # noqa: E402
from corral.supervisor.daemon import Supervisor  # noqa: E402
from corral.supervisor.home import home_dir as homes  # noqa: E402
from corral.supervisor.home.home_placement import USER_CODE_PINS, project_root_in  # noqa: E402
from corral.supervisor.home.project_lock import ProjectLock  # noqa: E402
from corral.supervisor.ledger import ledger_spec  # noqa: E402
from corral.supervisor.ledger.port import LedgerError  # noqa: E402
from corral.supervisor.spec.runtime_dirs import check_runtime_outside  # noqa: E402
from corral.supervisor.spec.swarm_spec import SpecError, SwarmSpec, empty_spec, load_spec  # noqa: E402

SPEC_SOURCE = "spec.source"


def _load(home: Path, spec_arg: str | None, *, adopted: bool) -> SwarmSpec:
    """The given spec, or the one the previous boot ran (so a restart brings it back).
    User code is pinned at ``corral up`` (a given spec) and enforced on every other
    boot: a restart, or an adopted partition (its node hands on its own pins)."""
    record = home / SPEC_SOURCE
    pins = home / USER_CODE_PINS
    inherited = os.environ.get(USER_CODE_ENV) if adopted else None
    if inherited:
        install(UserCodeRecord.from_json(inherited), recording=False)
    elif spec_arg or not pins.exists():
        install(UserCodeRecord(), recording=True)
    else:
        install(UserCodeRecord.from_json(pins.read_text()), recording=False)
    if spec_arg:
        path = Path(spec_arg).absolute()
        spec = load_spec(path)
        record.write_text(str(path))
        record.chmod(0o600)
    elif record.exists():
        spec = load_spec(Path(record.read_text().strip()))
    else:
        spec = empty_spec()
    frozen = freeze()
    if spec_arg and not adopted:
        pins.write_text(frozen.to_json())
        pins.chmod(0o600)
    # The fork server and every actor enforce exactly this; the user's module
    # directories were read as search roots (pythonpath_roots) and go no further.
    os.environ[USER_CODE_ENV] = frozen.to_json()
    os.environ.pop(USER_PATH_ENV, None)
    return spec


def _placement(home: Path, spec: SwarmSpec, args: argparse.Namespace) -> ledger_spec.Placement:
    if args.adopt:
        url = ledger_spec.check_url(os.environ.get(ledger_spec.URL_ENV))
        if args.epoch is None or not args.node:
            raise ledger_spec.LedgerSpecError("--adopt needs --node and --epoch")
        return ledger_spec.Placement(
            url, args.node, args.lease_s, args.retire_idle_s, adopt=args.adopt, epoch=args.epoch
        )
    placement = ledger_spec.resolve(home, spec.ledger, cli_url=None, cli_node=args.node)
    if placement.url:
        from urllib.parse import urlsplit

        from corral.core.redact import register_secret

        register_secret(urlsplit(placement.url).password or "")
    return placement


def _project_lock(home: Path, spec: SwarmSpec, placement: ledger_spec.Placement) -> ProjectLock | None:
    """The lock that makes this supervisor the project's one owner (seed 004 V1.1 §2),
    when agents work in a project: a home's alone, or shared by the nodes of one
    cluster, which are one owner (one ledger, one project revision: project_lock.py).
    A root that does not exist yet holds nothing to own: a spec whose agents never
    touch files runs as it did before the lock."""
    root = project_root_in(spec)
    if root is None or not root.is_dir():
        return None
    return ProjectLock(root, home, cluster=placement.cluster)


def _name_process() -> None:
    from corral.core.process_name import name_process

    name_process("corral:supervisor", "corral:sup")


def _preload_plan(spec: SwarmSpec) -> str:
    """What the fork server imports before forking: the spec's actors' templates
    (isolated children and delegates are agents too), and the providers its
    agents and child templates plan with."""
    templates = {actor.template for actor in spec.actors} | ({"agent"} if spec.templates else set())
    providers = {agent.provider for agent in spec.agents} | {template.provider for template in spec.templates}
    return preload_plan(templates, providers)


def main(argv: list[str] | None = None) -> int:
    drop_working_directory()
    parser = argparse.ArgumentParser(prog="python -m corral.supervisor")
    parser.add_argument("--home", required=True)
    parser.add_argument("--spec")
    parser.add_argument("--ready-fd", type=int)
    # The ledger URL comes in $CORRAL_LEDGER_URL (never argv: ps shows argv to all).
    parser.add_argument("--node", help="this node's id (a PostgreSQL ledger)")
    parser.add_argument("--adopt", help="run an adopted partition (started by a node, not by hand)")
    parser.add_argument("--epoch", type=int, help="the fencing epoch the adopting node took")
    parser.add_argument("--lease-s", type=float, default=ledger_spec.DEFAULT_LEASE_S)
    parser.add_argument("--retire-idle-s", type=float, default=ledger_spec.DEFAULT_RETIRE_IDLE_S)
    args = parser.parse_args(argv)
    ready_fd = args.ready_fd

    def fail(message: str, code: int) -> int:
        print(f"corral: {message}", file=sys.stderr)
        if ready_fd is not None:
            os.write(ready_fd, f"error {message}\n".encode())
            os.close(ready_fd)
        return code

    _name_process()  # first: the title is set in place of argv, before the environment changes
    try:
        home = homes.ensure_home(Path(args.home).absolute())
        lock = homes.HomeLock(home)
        lock.acquire()
    except homes.HomeError as exc:
        return fail(str(exc), 3)
    try:
        spec = _load(home, args.spec, adopted=bool(args.adopt))
        placement = _placement(home, spec, args)
        check_runtime_outside(project_root_in(spec))  # a .pth written there would run here: spec/runtime_dirs.py
        # From here on this process and everything it starts work in a directory corral
        # owns (the spec's path was made absolute above), never the project's.
        os.chdir(home)
    except (SpecError, ledger_spec.LedgerSpecError, UserCodeError) as exc:
        lock.release()
        return fail(str(exc), 2)
    project = _project_lock(home, spec, placement)
    try:
        if project is not None:
            project.acquire()
    except homes.HomeError as exc:  # busy, or a root or owners directory that cannot be used
        lock.release()
        return fail(str(exc), 3)
    # The fork server and every actor import the same tool modules as the spec did here.
    os.environ[TOOL_MODULES_ENV] = json.dumps(list(spec.tool_modules))
    # And the fork server preloads what this spec starts, not every template.
    os.environ[PRELOAD_ENV] = _preload_plan(spec)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(levelname)s %(message)s")
    try:
        supervisor = Supervisor(home, spec, ready_fd=ready_fd, lock=lock, placement=placement)
    except (LedgerError, CorralError) as exc:
        if project is not None:
            project.release()
        lock.release()
        return fail(str(exc), 4)
    # Everything built so far lives as long as the process: out of the collector's
    # reach for good, and the collector back on for what the supervisor makes next.
    gc.freeze()
    gc.enable()
    try:
        trio.run(supervisor.run)
    finally:
        supervisor.ledger.close()
        if project is not None:
            project.release()
        lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
