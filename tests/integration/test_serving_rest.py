"""The registered model served over REST by MLflow's own scoring server (`mlflow models
serve`), as a user's REST client meets it. The pyfunc model itself: test_tracking.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.small_pyfunc import registered_model

pytestmark = pytest.mark.both_stacks


@pytest.mark.slow  # MLflow's scoring server in its own process (seconds to start)
def test_mlflow_models_serve_scores_integer_ids_and_answers_a_refused_row_with_its_reason(
        tmp_path):
    """What a user's REST client meets: the `Any` signature columns (integer ids, a null
    history) through MLflow's own JSON parsing, and a row the pyfunc refuses. That refusal was
    MLflow's "unexpected error while evaluating the model", the reason only on the last line
    of a server-side traceback; it is now the answer's message, HTTP 400."""
    import signal
    import socket
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    bin_folder = Path(sys.executable).parent  # the server execs `uvicorn` from PATH
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        [str(bin_folder / "mlflow"), "models", "serve", "-m", registered_model(tmp_path),
         "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "PYTHONPATH": str(REPO),
             "PATH": f"{bin_folder}{os.pathsep}{os.environ.get('PATH', '')}"},
        cwd=tmp_path, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def post(body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(f"{url}/invocations", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, json.load(answer)
        except urllib.error.HTTPError as refused:
            return refused.code, json.load(refused)

    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/ping", timeout=5).close()
                break
            except OSError:
                assert server.poll() is None, log.read_text()[-2000:]
                time.sleep(0.5)
        records = [{"client_id": "c1", "items": ["10", "11"]}, {"client_id": 7, "items": [10, 11]},
                   {"client_id": "c3", "items": None}]
        status, answer = post({"dataframe_records": records, "params": {"k": 3}})
        assert status == 200, answer
        top = answer["predictions"]
        assert [row["client_id"] for row in top] == ["c1", "7", "c3"]
        assert top[1]["item_ids"] == top[0]["item_ids"] and len(top[0]["item_ids"]) == 3
        assert top[2]["item_ids"] == [] and top[2]["scores"] == []
        status, answer = post({"dataframe_records": [
            {"client_id": "c1", "items": ["10", "11"], "values": [1.0, 1e30]}]})
        assert status == 400, answer
        assert "client c1: `values` must be finite numbers between -1e+15 and 1e+15" in \
            answer["message"], answer
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
