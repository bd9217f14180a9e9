"""`txbroker console`: the web console (txbroker.console), served until interrupted."""

from __future__ import annotations

import asyncio
import os
import signal

from txbroker.cli.security_opts import add_arguments, credentials, tls


def register(sub, default_admin: str) -> None:
    p = sub.add_parser(
        "console", help="serve the web console: brokers, topics, messages, groups, dead letters, transactions",
        description="Serve a small web console over the brokers' admin API: each broker's role, epoch and "
                    "replication; topics and queues; messages by id or key; consumer groups and their lag; dead "
                    "letters, with re-send; pending and parked transactions, with commit, roll back and resume "
                    "(each confirmed first); the operator's recent Events when running in a cluster. When the "
                    "brokers require authentication, every page asks for HTTP Basic credentials (an access key "
                    "and secret the brokers know, with the admin permission for actions or monitor for reading "
                    "only) and the brokers check them; actions always carry the visitor's own credentials.",
        epilog="example: txbroker console --admin http://10.0.0.5:10912,http://10.0.0.6:10912 --listen 0.0.0.0:8090")
    p.add_argument("--admin", default=default_admin, metavar="URL[,URL...]",
                   help="the brokers' admin URLs, comma-separated (master and slaves; actions go to the live "
                        "master) (default %(default)s, env TXBROKER_ADMIN)")
    p.add_argument("--listen", default=os.environ.get("TXBROKER_CONSOLE_LISTEN", "127.0.0.1:8090"), metavar="HOST:PORT",
                   help="where the console serves HTTP (default %(default)s, env TXBROKER_CONSOLE_LISTEN; port 0 "
                        "takes a free one, printed at start); serve it behind TLS (an ingress) beyond localhost: "
                        "HTTP Basic credentials travel with every request")
    p.add_argument("--broker", metavar="HOST:PORT[,...]",
                   help="the brokers' data-plane addresses, for message data (by key, lag, dead letters); default: "
                        "the master's configured listen address, on its admin URL's host")
    add_arguments(p)
    p.set_defaults(run=run)
    # --access-key/--secret-file here are the console's service account: the views are read with it;
    # the visitors still log in when the brokers require it, and act with their own credentials.
    for action in p._actions:
        if action.dest == "access_key":
            action.help = ("service account's access key (env TXBROKER_ACCESS_KEY), secret from TXBROKER_SECRET_KEY "
                           "or --secret-file: views are read with it (e.g. the operator's monitor user); visitors "
                           "still log in when the brokers require it, and act with their own credentials")


def run(args) -> int:
    from txbroker.console.app import build

    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {args.listen!r}")
    urls = [u.strip() for u in args.admin.split(",") if u.strip()]
    data = [a.strip() for a in args.broker.split(",") if a.strip()] if args.broker else None
    app = build(urls, credentials=credentials(args), tls=tls(args), data_addresses=data)
    asyncio.run(_serve(app, host.strip("[]") or "0.0.0.0", int(port), urls))
    return 0


async def _serve(app, host: str, port: int, urls: list[str]) -> None:
    """Bind, then say where: the line names the bound port, so `--listen HOST:0` is usable (a test
    or a script reads the line rather than guessing a free port another process may take first)."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    print(f"txbroker console on http://{shown}:{bound[1]}/ for {', '.join(urls)}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
