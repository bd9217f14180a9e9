"""HTML for the console: one layout (string.Template) and small helpers. Every value goes through
`esc` unless it is `Html` (markup built here from escaped parts), so nothing a broker stores (topic
names, keys, bodies, remarks) is ever markup."""

from __future__ import annotations

import datetime as dt
import html
import urllib.parse
from string import Template


class Html(str):
    """Markup that is already safe."""


def esc(value) -> Html:
    if isinstance(value, Html):
        return value
    return Html(html.escape("" if value is None else str(value), quote=True))


def join(parts) -> Html:
    return Html("".join(esc(p) for p in parts))


_VOID = frozenset({"input", "br", "meta"})


def tag(element: str, content="", /, **attrs) -> Html:
    a = "".join(f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in attrs.items() if v is not None)
    if element in _VOID:
        return Html(f"<{element}{a}>")
    return Html(f"<{element}{a}>{esc(content)}</{element}>")


def link(href: str, text) -> Html:
    return tag("a", text, href=href)


def url(path: str, **query) -> str:
    q = {k: v for k, v in query.items() if v not in (None, "")}
    return path + ("?" + urllib.parse.urlencode(q) if q else "")


def seg(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def table(headers, rows, cls: str = "") -> Html:
    head = join(tag("th", h) for h in headers)
    body = join(Html("<tr>" + join(tag("td", c) for c in row) + "</tr>") for row in rows)
    if not rows:
        body = Html(f'<tr><td colspan="{len(headers)}" class="empty">none</td></tr>')
    return Html(f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def ms_time(ms: int) -> str:
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def post_form(action: str, csrf: str, button: str, cls: str = "", fields: dict | None = None) -> Html:
    hidden = join(tag("input", type="hidden", name=k, value=v) for k, v in {"csrf": csrf, **(fields or {})}.items())
    return Html(f'<form method="post" action="{esc(action)}" class="inline">{hidden}'
                f'<button type="submit" class="{esc(cls)}">{esc(button)}</button></form>')


NAV = (("/", "Brokers"), ("/topics", "Topics"), ("/messages", "Messages"), ("/groups", "Consumer groups"),
       ("/transactions", "Transactions"), ("/jobs", "Jobs"), ("/events", "Operator events"))

_LAYOUT = Template("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>$title · txbroker console</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:"DejaVu Sans",sans-serif;margin:0;color:#1d2329;background:#f5f6f8;font-size:14px}
header{background:#1f3a5f;color:#fff;padding:10px 20px;display:flex;gap:18px;align-items:center}
header a{color:#dbe7f5;text-decoration:none}header a.on{color:#fff;font-weight:bold;border-bottom:2px solid #fff}
header .who{margin-left:auto;font-size:12px;color:#dbe7f5}
main{padding:16px 20px}h1{font-size:20px;margin:4px 0 14px}h2{font-size:16px;margin:18px 0 8px}
table{border-collapse:collapse;background:#fff;margin-bottom:12px;min-width:40%}
th,td{border:1px solid #d5d9de;padding:5px 9px;text-align:left;vertical-align:top}
th{background:#e8ecf1}td.empty{color:#777;font-style:italic}
.flash{padding:8px 12px;margin-bottom:12px;border-radius:3px}.ok{background:#e3f4e5;border:1px solid #7bc285}
.err{background:#fbe5e5;border:1px solid #e08a8a}.note{background:#eef2f7;border:1px solid #b8c4d3}
form.inline{display:inline;margin:0 2px}button{cursor:pointer;padding:3px 10px}
button.danger{background:#c0392b;color:#fff;border:1px solid #922}button.go{background:#1e7a3c;color:#fff;border:1px solid #155}
.state-PARKED{color:#b35900;font-weight:bold}.state-PREPARED{color:#1f3a5f;font-weight:bold}
.state-COMMITTED{color:#1e7a3c;font-weight:bold}.state-ROLLED_BACK,.state-ABORTED{color:#922;font-weight:bold}
.state-OPEN{color:#5b4a00;font-weight:bold}
.role-master{font-weight:bold;color:#1e7a3c}pre{background:#fff;border:1px solid #d5d9de;padding:8px;white-space:pre-wrap}
input[type=text]{padding:3px 6px}
</style></head>
<body><header><strong>txbroker</strong>$nav<span class="who">$who</span></header>
<main><h1>$title</h1>$flash$body</main></body></html>
""")


def page(title: str, body, *, active: str = "", who: str = "", flash: Html | None = None) -> str:
    nav = join(tag("a", text, href=href, class_="on" if href == active else None) for href, text in NAV)
    return _LAYOUT.substitute(title=esc(title), nav=nav, who=esc(who), flash=flash or "", body=esc(body))


def flash(kind: str, text) -> Html:
    return tag("div", text, class_=f"flash {kind}")
