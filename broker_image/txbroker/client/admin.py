"""A small blocking client for the broker's admin API (used by the CLI and by tests)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from txbroker.client.errors import BrokerUnavailable, ClientError


class AdminError(ClientError):
    def __init__(self, status: int, code: str, message: str):
        self.status = status
        self.code = code
        super().__init__(f"{message} ({code or status})")


class AdminClient:
    def __init__(self, url: str, timeout: float = 10.0):
        if "://" not in url:
            url = "http://" + url
        self.url = url.rstrip("/")
        self.timeout = timeout

    def request(self, method: str, path: str, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
                ctype = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                doc = json.loads(raw)
                raise AdminError(e.code, doc.get("code", ""), doc.get("error", raw.decode())) from None
            except ValueError:
                raise AdminError(e.code, "", raw.decode(errors="replace")) from None
        except (urllib.error.URLError, OSError) as e:
            raise BrokerUnavailable(f"admin API at {self.url} unreachable: {getattr(e, 'reason', e)}") from None
        return json.loads(raw) if "json" in ctype else raw.decode()

    def get(self, path: str):
        return self.request("GET", path)

    def post(self, path: str, body=None):
        return self.request("POST", path, body if body is not None else {})

    def put(self, path: str, body):
        return self.request("PUT", path, body)
