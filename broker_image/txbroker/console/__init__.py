"""The web console (`txbroker console`, issue 21): a small server-rendered aiohttp application over
the brokers' admin API (AdminClient) and, for message data, the client library.

  brokers.py   what the pages show, gathered from the brokers (roles, topics, transactions, groups
               and lag, dead letters and their re-send), with the credentials of the request
  pages.py     HTML: one string.Template layout, every value escaped
  jobs.py      HTML of the Jobs pages: a job's fields, decision and members per group (pure functions)
  security.py  who is asking: HTTP Basic checked by the brokers (GET /api/v1/whoami), CSRF tokens
  events.py    the operator's recent Kubernetes Events, in a cluster only
  app.py       routes: views are GETs; every action is a confirmation page (GET) and a POST
"""
