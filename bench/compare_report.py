"""The side-by-side table of bench/compare.py: one per flush mode, Markdown, txbroker beside RocketMQ.

Rows come from the normalized `figures` of each case (compare_txbroker.figures_of,
compare_rocketmq.figures_of). A ratio is ours/theirs: for rates higher is better for us, for
latencies and times lower is better; the `better` column says which.
"""

from __future__ import annotations

NOTE_ONEWAY = "RocketMQ's END_TRANSACTION is one-way (not in its latency); ours is acknowledged"


def num(x, unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, int) or abs(x) >= 100:
        s = f"{x:,.0f}"
    elif abs(x) >= 10:
        s = f"{x:.1f}"
    else:
        s = f"{x:.2f}"
    return s + unit


def ratio(a, b) -> str:
    if a is None or b is None or not b:
        return "-"
    r = a / b
    return f"{r:.2f}" if r < 10 else f"{r:.1f}"


def pair(a, b) -> str:
    return f"{num(a)} / {num(b)}"


def cpu_us_per(r: dict | None, key: str = "ops_per_s"):
    """Broker process CPU per operation (or per message) in microseconds: less sensitive to the
    machine's other load than the rates (txbroker's broker process; RocketMQ's broker JVM, or the
    proxy JVM holding the broker for the Python client)."""
    if r is None or r.get("error"):
        return None
    rate = (r.get("figures") or {}).get(key)
    pct = ((r.get("meter") or {}).get("server_pct"))
    if not rate or pct is None:
        return None
    return pct / 100.0 / rate * 1e6


def unequal_load(o: dict | None, t: dict | None, limit: float = 50.0) -> str:
    """A warning when other work on the machine used very different CPU during the two cases."""
    a = ((o or {}).get("meter") or {}).get("others_pct")
    b = ((t or {}).get("meter") or {}).get("others_pct")
    if a is None or b is None or abs(a - b) <= limit:
        return ""
    return f"UNEQUAL LOAD: other work {a:.0f}% vs {b:.0f}% of a core"


def load_cell(r: dict | None) -> str:
    m = (r or {}).get("meter") or {}
    la = m.get("loadavg_after") or []
    if not la:
        return "-"
    return f"{la[0]:.1f}, {m.get('others_pct', 0):.0f}%"


class Table:
    def __init__(self, flush: str, results: list[dict]):
        self.flush = flush
        self.rows: list[list[str]] = []
        self.by = {}
        for r in results:
            if r.get("flush") != flush or r.get("is_warmup"):
                continue
            key = (r["system"], r.get("driver", "") if r["system"] == "rocketmq" else "", r.get("case"))
            self.by[key] = r

    def get(self, system: str, case: str, driver: str = "") -> dict | None:
        if system == "rocketmq" and not driver:
            driver = "TxBench (Java)"
        return self.by.get((system, driver if system == "rocketmq" else "", case))

    @staticmethod
    def fig(r: dict | None, key: str):
        if r is None or r.get("error"):
            return None
        return (r.get("figures") or {}).get(key)

    def add(self, workload, conc, metric, ours, theirs, rat, better, load="", notes=""):
        self.rows.append([workload, str(conc), metric, ours, theirs, rat, better, load, notes])

    def rate_and_latency(self, label: str, conc: int, ours: dict | None, theirs: dict | None, unit: str,
                         notes: str = "", rate_key: str = "ops_per_s") -> None:
        f = self.fig
        self.add(label, conc, unit, num(f(ours, rate_key)), num(f(theirs, "ops_per_s")),
                 ratio(f(ours, rate_key), f(theirs, "ops_per_s")), "higher",
                 f"{load_cell(ours)} / {load_cell(theirs)}",
                 "; ".join(x for x in (notes, _err(ours, theirs), unequal_load(ours, theirs)) if x))
        self.add("", "", "p50 / p99 ms", pair(f(ours, "p50_ms"), f(ours, "p99_ms")),
                 pair(f(theirs, "p50_ms"), f(theirs, "p99_ms")),
                 f"{ratio(f(ours, 'p50_ms'), f(theirs, 'p50_ms'))} / {ratio(f(ours, 'p99_ms'), f(theirs, 'p99_ms'))}",
                 "lower")
        cu_o, cu_t = cpu_us_per(ours, rate_key), cpu_us_per(theirs)
        self.add("", "", "broker CPU us/" + ("msg" if rate_key == "msgs_per_s" else "op"), num(cu_o), num(cu_t),
                 ratio(cu_o, cu_t), "lower")

    def group_counts(self) -> list[int]:
        """Broker-group counts of the cases `tx_c<n>_g<groups>` (compare.py --groups)."""
        return sorted({int(case.rsplit("_g", 1)[1]) for _, _, case in self.by
                       if case and case.startswith("tx_c") and "_g" in case})

    def build(self) -> "Table":
        f = self.fig
        for n in (1, 8, 32):
            self.rate_and_latency("1. tx, single message" if n == 1 else "", n, self.get("txbroker", f"tx_c{n}"),
                                  self.get("rocketmq", f"tx_c{n}"), "tx/s",
                                  notes=(f"{NOTE_ONEWAY}; RocketMQ: Java driver, 1 producer shared by the threads"
                                         if n == 1 else ""))
        variants = (("1conn", "1. tx, ours also on one connection", "txbroker: one AsyncTransactionProducer with n "
                     "transactions in flight, the connection layout of RocketMQ's driver"),
                    ("pipelined", "1. tx, END not waited for", "txbroker: wait_end=False, each END acknowledged "
                     "(counted then) while the next transaction goes; RocketMQ's END is one-way"))
        for suffix, title, note in variants:
            first = True
            for n in (1, 8, 32):
                ours = self.get("txbroker", f"tx_c{n}_{suffix}")
                if ours is None:
                    continue
                self.rate_and_latency(title if first else "", n, ours, self.get("rocketmq", f"tx_c{n}"), "tx/s",
                                      notes=note if first else "")
                first = False
        for g in self.group_counts():
            for n in (1, 8, 32):
                o, t = self.get("txbroker", f"tx_c{n}_g{g}"), self.get("rocketmq", f"tx_c{n}_g{g}")
                if not (o or t):
                    continue
                self.rate_and_latency(f"1. tx, {g} broker groups" if n == 1 else "", n, o, t, "tx/s",
                                      notes=(f"{g} masters each side, topic on all (8 queues each); ours: cluster "
                                             "producers, each transaction whole to one group in turn; theirs: TxBench "
                                             "spreading over every queue; broker CPU = all brokers summed"
                                             if n == 1 else ""))
                self.add("", "", "clients CPU % (of 200)", num(_meter(o, "clients_pct")), num(_meter(t, "clients_pct")),
                         ratio(_meter(o, "clients_pct"), _meter(t, "clients_pct")), "",
                         notes="the load generator's share of the 2 cores (all our processes but the brokers)")
        for n in (1, 8, 32):
            py = self.get("rocketmq", f"tx_c{n}", "rocketmq-python-client")
            if py is None:
                continue
            self.rate_and_latency("1. tx, vs RocketMQ's Python client" if n == 1 else "", n,
                                  self.get("txbroker", f"tx_c{n}"), py, "tx/s",
                                  notes=("rocketmq-python-client 5.1.2 via gRPC proxy (local mode); it waits for "
                                         "the proxy's answer, the proxy forwards END_TRANSACTION one-way"
                                         if n == 1 else ""))
        o, t = self.get("txbroker", "checkback_c8"), self.get("rocketmq", "checkback_c8")
        if o or t:
            self.add("2. 1/3 UNKNOWN, check-back", 8, "tx/s while sending", num(f(o, "ops_per_s")),
                     num(f(t, "ops_per_s")), ratio(f(o, "ops_per_s"), f(t, "ops_per_s")), "higher",
                     f"{load_cell(o)} / {load_cell(t)}",
                     "; ".join(x for x in (_checkback_note(o, t), unequal_load(o, t)) if x))
            self.add("", "", "all resolved, s after sends stop", num(f(o, "all_resolved_after_send_end_s")),
                     num(f(t, "all_resolved_after_send_end_s")),
                     ratio(f(o, "all_resolved_after_send_end_s"), f(t, "all_resolved_after_send_end_s")), "lower")
            self.add("", "", "check-backs / UNKNOWN tx", pair(f(o, "checks"), f(o, "local_unknown")),
                     pair(f(t, "checks"), f(t, "local_unknown")),
                     ratio(f(o, "checks_per_unknown"), f(t, "checks_per_unknown")), "lower (1 = one each)")
            self.add("", "", "UNKNOWN to resolved p50 / max s", pair(f(o, "resolve_p50_s"), f(o, "resolve_max_s")),
                     pair(f(t, "resolve_p50_s"), f(t, "resolve_max_s")),
                     f"{ratio(f(o, 'resolve_p50_s'), f(t, 'resolve_p50_s'))} / "
                     f"{ratio(f(o, 'resolve_max_s'), f(t, 'resolve_max_s'))}", "lower")
        for case, conc, label in (("delivery_light_c1", 1, "3. commit to delivery, light"),
                                  ("delivery_saturated_c8", 8, "3. commit to delivery, saturated")):
            o, t = self.get("txbroker", case), self.get("rocketmq", case)
            if not (o or t):
                continue
            self.add(label, conc, "p50 / p99 ms", pair(f(o, "deliver_p50_ms"), f(o, "deliver_p99_ms")),
                     pair(f(t, "deliver_p50_ms"), f(t, "deliver_p99_ms")),
                     f"{ratio(f(o, 'deliver_p50_ms'), f(t, 'deliver_p50_ms'))} / "
                     f"{ratio(f(o, 'deliver_p99_ms'), f(t, 'deliver_p99_ms'))}", "lower",
                     f"{load_cell(o)} / {load_cell(t)}",
                     f"at {num(f(o, 'ops_per_s'))} vs {num(f(t, 'ops_per_s'))} tx/s; delivered "
                     f"{num(f(o, 'delivered'))} vs {num(f(t, 'delivered'))}, missing {num(f(o, 'not_delivered'))} vs "
                     f"{num(f(t, 'not_delivered'))}, duplicates {num(f(o, 'duplicates'))} vs {num(f(t, 'duplicates'))}"
                     + (f"; {unequal_load(o, t)}" if unequal_load(o, t) else ""))
        for n in (1, 8, 32):
            self.rate_and_latency("4. plain sends" if n == 1 else "", n, self.get("txbroker", f"send_c{n}"),
                                  self.get("rocketmq", f"send_c{n}"), "msgs/s")
        for n in (1, 8, 32):
            o = self.get("txbroker", f"batch100_c{n}")
            if o is None:
                continue
            t = self.get("rocketmq", f"tx_c{n}")
            self.add("5. tx of 100 messages (ours) vs single-message tx (theirs)" if n == 1 else "", n, "msgs/s",
                     num(f(o, "msgs_per_s")), num(f(t, "ops_per_s")), ratio(f(o, "msgs_per_s"), f(t, "ops_per_s")),
                     "higher", f"{load_cell(o)} / {load_cell(t)}",
                     "; ".join(x for x in ("RocketMQ has no multi-message transaction: its row is workload 1"
                                           if n == 1 else "", unequal_load(o, t)) if x))
            self.add("", "", "p50 / p99 ms per tx", pair(f(o, "p50_ms"), f(o, "p99_ms")),
                     pair(f(t, "p50_ms"), f(t, "p99_ms")), "", "(100 messages vs 1)")
            cu_o, cu_t = cpu_us_per(o, "msgs_per_s"), cpu_us_per(t)
            self.add("", "", "broker CPU us/msg", num(cu_o), num(cu_t), ratio(cu_o, cu_t), "lower")
        return self

    def markdown(self) -> list[str]:
        hdr = ["workload", "conc.", "metric", "txbroker", "RocketMQ", "ours/theirs", "better",
               "load1, others% (ours / theirs)", "notes"]
        lines = ["| " + " | ".join(hdr) + " |", "|" + "|".join("---" for _ in hdr) + "|"]
        for r in self.rows:
            lines.append("| " + " | ".join(c.replace("|", "/") for c in r) + " |")
        return lines


def _meter(r: dict | None, key: str):
    if r is None or r.get("error"):
        return None
    return (r.get("meter") or {}).get(key)


def _err(*rs) -> str:
    errs = [f"{r['system']}: {r['error'][:120]}" for r in rs if r and r.get("error")]
    return "ERROR " + "; ".join(errs) if errs else ""


def _checkback_note(o, t) -> str:
    def one(r, who):
        if r is None:
            return f"{who}: not run"
        if r.get("error"):
            return f"{who}: ERROR {r['error'][:100]}"
        f = r["figures"]
        s = (f"{who}: delivered {num(f.get('delivered'))}/{num(f.get('expected'))}, duplicates "
             f"{num(f.get('duplicates'))}, unresolved {num(f.get('unresolved_at_end'))}")
        if f.get("checkbacks_sent_by_broker") is not None:
            s += f", broker sent {num(f['checkbacks_sent_by_broker'])} checks"
        return s
    return f"{one(o, 'ours')}; {one(t, 'theirs')}"


def tables(results: list[dict], flushes: list[str]) -> dict[str, list[str]]:
    return {fl: Table(fl, results).build().markdown() for fl in flushes}
