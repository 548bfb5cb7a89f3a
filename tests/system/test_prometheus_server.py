"""The real Prometheus server scrapes two real `nodecheck serve` exporters on loopback (a healthy
H100 node and the same node with a GPU trained at x8); the downtraining alert fires for the degraded
one only, checked through Prometheus's HTTP API, and the real Alertmanager delivers it to a webhook. When
the degraded node's exporter dies, that alert goes quiet with its series and NodecheckExporterDown names it."""

import http.server
import json
import re
import shutil
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest
from helpers import (
    REPO,
    free_port,
    get_json,
    h100_node_snapshot,
    h100_nvml_records,
    make_snapshot,
    wait_for,
)

DEADLINE = 90  # seconds for the whole chain: first scrape (~5 s), rule evaluation, Alertmanager


class Webhook(http.server.BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        Webhook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_alert_fires_for_the_degraded_node_only(tmp_path, processes):
    for binary in ("prometheus", "prometheus-alertmanager"):
        if shutil.which(binary) is None:
            pytest.skip(f"{binary} is not installed (apt install prometheus prometheus-alertmanager)")
    healthy = h100_node_snapshot(tmp_path / "healthy")
    degraded = h100_node_snapshot(tmp_path / "degraded")
    make_snapshot(tmp_path / "x8", nvml_gpus=[dict(h100_nvml_records()[0], width=8)])
    (degraded / "nvml.json").write_text((tmp_path / "x8" / "nvml.json").read_text())

    targets, exporters = {}, {}
    for name, snap in (("healthy", healthy), ("degraded", degraded)):
        port = free_port()
        targets[name] = f"127.0.0.1:{port}"
        exporters[name] = processes([sys.executable, "-m", "nodecheck", "serve", "--listen", targets[name], "--from", str(snap),
                   "--interval", "1"], tmp_path / f"{name}.log")

    hook = http.server.HTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    Webhook.received = []

    # the shipped rules, with their `for:` shortened so the test does not wait minutes
    rules = re.sub(r"for: \d+m", "for: 2s", (REPO / "deploy/prometheus/nodecheck-rules.yml").read_text())
    (tmp_path / "rules.yml").write_text(rules)
    am_port, prom_port = free_port(), free_port()
    (tmp_path / "am.yml").write_text(json.dumps({
        "route": {"receiver": "hook", "group_by": ["alertname", "instance"], "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": f"http://127.0.0.1:{hook.server_port}/"}]}]}))
    (tmp_path / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "nodecheck", "static_configs": [{"targets": list(targets.values())}]}]}))
    processes(["prometheus-alertmanager", f"--config.file={tmp_path}/am.yml", f"--storage.path={tmp_path}/am",
               f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="], tmp_path / "am.log")
    processes(["prometheus", f"--config.file={tmp_path}/prometheus.yml", f"--storage.tsdb.path={tmp_path}/tsdb",
               f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prometheus.log")

    deadline = time.monotonic() + DEADLINE
    api = f"http://127.0.0.1:{prom_port}/api/v1"

    def query(expr: str) -> list:
        return get_json(f"{api}/query?" + urllib.parse.urlencode({"query": expr}))["data"]["result"]

    up = wait_for(lambda: len([r for r in query("up == 1")]) == 2 and query("up == 1"), "both exporters scraped", deadline)
    assert {r["metric"]["instance"] for r in up} == set(targets.values())
    firing = wait_for(lambda: query('ALERTS{alertname="NodecheckPcieLinkDowntrained",alertstate="firing"}'),
                      "the downtraining alert to fire", deadline)
    assert [(r["metric"]["instance"], r["metric"]["gpu"]) for r in firing] == [(targets["degraded"], "0")]
    assert query(f'ALERTS{{instance="{targets["healthy"]}"}}') == []
    delivered = wait_for(lambda: [a for batch in Webhook.received for a in batch["alerts"]
                                  if a["labels"]["alertname"] == "NodecheckPcieLinkDowntrained"],
                         "Alertmanager to deliver the alert", deadline)
    assert {a["labels"]["instance"] for a in delivered} == {targets["degraded"]}
    assert delivered[0]["annotations"]["summary"] == f"gpu0 on {targets['degraded']} runs PCIe x8, below its max width"
    hook.shutdown()

    exporters["degraded"].kill()  # a crash: no goodbye
    deadline = time.monotonic() + DEADLINE
    down = wait_for(lambda: query('ALERTS{alertname="NodecheckExporterDown",alertstate="firing"}'),
                    "the exporter-down alert to fire", deadline)
    assert [r["metric"]["instance"] for r in down] == [targets["degraded"]]
    wait_for(lambda: not query('ALERTS{alertname="NodecheckPcieLinkDowntrained"}'), "the downtraining alert to go quiet", deadline)
