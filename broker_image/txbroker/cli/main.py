"""`txbroker`: run a broker, manage topics, send and read messages, handle stuck transactions."""

from __future__ import annotations

import argparse
import os
import sys

from txbroker import __version__
from txbroker.cli import auth_cmd, backup_cmd, broker_cmd, cluster_cmd, console_cmd, job_cmd, lookup_cmd, messages_cmd, replication_cmd, topic_cmd, tx_cmd

DEFAULT_BROKER = os.environ.get("TXBROKER_BROKER", "127.0.0.1:10911")
DEFAULT_ADMIN = os.environ.get("TXBROKER_ADMIN", "http://127.0.0.1:10912")


def version_line() -> str:
    """`txbroker 0.2.0 (store format 5; opens formats 1-5)`: older formats are upgraded in place."""
    from txbroker.broker.replication.compat import formats
    from txbroker.store.records import READABLE_FORMATS, STORE_FORMAT_VERSION
    return f"txbroker {__version__} (store format {STORE_FORMAT_VERSION}; opens formats {formats(READABLE_FORMATS)})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="txbroker",
        description="Transactional messaging in the style of Apache RocketMQ. Data-plane commands talk to "
                    "--broker (env TXBROKER_BROKER); management commands to the admin API at --admin "
                    "(env TXBROKER_ADMIN). Brokers that require credentials or TLS: --access-key with "
                    "TXBROKER_SECRET_KEY, --tls-ca (or the TXBROKER_ACCESS_KEY, TXBROKER_TLS_* variables).",
    )
    p.add_argument("--version", action="version", version=version_line(),
                   help="show the version, the store format it writes and those it opens, and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker_cmd.register(sub)
    topic_cmd.register(sub, DEFAULT_ADMIN)
    messages_cmd.register(sub, DEFAULT_BROKER)
    lookup_cmd.register(sub, DEFAULT_BROKER)
    cluster_cmd.register(sub, DEFAULT_BROKER)
    tx_cmd.register(sub, DEFAULT_ADMIN)
    job_cmd.register(sub, DEFAULT_ADMIN)
    backup_cmd.register(sub, DEFAULT_ADMIN)
    replication_cmd.register(sub, DEFAULT_ADMIN)
    auth_cmd.register(sub)
    console_cmd.register(sub, DEFAULT_ADMIN)
    _describe_commands(p)
    return p


def _describe_commands(parser: argparse.ArgumentParser) -> None:
    """A command's own --help opens with what it does: its one-line help from the parent's list,
    where it was given no longer description."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                text = helps.get(name)
                if not child.description and text:
                    child.description = text[0].upper() + text[1:] + "."
                _describe_commands(child)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - print a clear line, not a traceback, for expected failures
        from txbroker.broker.config import ConfigError
        from txbroker.client.errors import ClientError
        if isinstance(e, (ClientError, ConfigError, ValueError)):
            print(f"txbroker {args.command}: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
