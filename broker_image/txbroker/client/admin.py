"""A small blocking client for the broker's admin API (used by the CLI and by tests).

With `credentials` it sends HTTP Basic (access key and secret; the broker checks them against the
same hashed store as the data plane, and wants the admin permission under /api/). With `tls` it
speaks HTTPS, verifying the broker with the CA given and presenting a client certificate if one is
given (the broker may require one under /api/).
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request

from txbroker.client.errors import BrokerUnavailable, ClientError
from txbroker.client.security import as_credentials, as_tls, tls_error


class AdminError(ClientError):
    def __init__(self, status: int, code: str, message: str):
        self.status = status
        self.code = code
        super().__init__(f"{message} ({code or status})")


class AdminClient:
    def __init__(self, url: str, timeout: float = 10.0, *, credentials=None, tls=None):
        self.tls = as_tls(tls)
        if "://" not in url:
            url = ("https://" if self.tls is not None else "http://") + url
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._ssl = self.tls.context() if self.tls is not None else None
        creds = as_credentials(credentials)
        self._auth = None
        if creds is not None:
            token = base64.b64encode(f"{creds.access_key}:{creds.secret_key}".encode()).decode()
            self._auth = f"Basic {token}"

    def request(self, method: str, path: str, body=None):
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        if self._auth is not None:
            headers["Authorization"] = self._auth
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                raw = resp.read()
                ctype = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                doc = json.loads(raw)
                raise AdminError(e.code, doc.get("code", ""), doc.get("error", raw.decode())) from None
            except ValueError:
                raise AdminError(e.code, "", raw.decode(errors="replace")) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLError):
                raise tls_error(self.url, e.reason) from None
            raise BrokerUnavailable(f"admin API at {self.url} unreachable: {e.reason}") from None
        except ssl.SSLError as e:
            raise tls_error(self.url, e) from None
        except OSError as e:
            raise BrokerUnavailable(f"admin API at {self.url} unreachable: {getattr(e, 'reason', e)}") from None
        return json.loads(raw) if "json" in ctype else raw.decode()

    def get(self, path: str):
        return self.request("GET", path)

    def post(self, path: str, body=None):
        return self.request("POST", path, body if body is not None else {})

    def put(self, path: str, body):
        return self.request("PUT", path, body)
