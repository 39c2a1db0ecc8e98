"""A score is a pure function of the response: the same responses scored in fresh processes score the same.

The responses are committed benign rows (``results/cpu/qwen2.5-coder-1.5b``) whose IFEval language checks
(``language:response_language``, ``change_case:english_capital``, ``change_case:english_lowercase``) call langdetect:
unseeded, each check's verdict on them was a coin toss from run to run (1477's Persian read as Urdu about half the
time, 2416's capitals as Vietnamese, 3494's German as English, 218's "[italy]" as Tagalog), so without
``metrics._ifeval`` seeding langdetect the six scorings of each response below (two processes, three each) agree for
all five with a chance of about one in ten million.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fairkv.core import data, metrics
from fairkv.runs import rescore
from fairkv.runs.store import ResultsStore

DAYS = "\n".join(f"- DAY {day}: VISIT THE NEW YORK METROPOLITAN TRANSPORTATION SYSTEM" for day in range(6, 12))
# sys_ifeval_shuffled key and response of committed rows (by cell id)
RESPONSES = {
    "145e757ea43e858ff32e9886": (
        2416,
        "CITY OF NEW YORK, NEW YORK, USA\n- DAY 1: ARRIVE AT NEW YORK CITY\n"
        "- DAY 2: VISIT THE STATUE OF LIBERTY AND THE NEW YORK METROPOLITAN TRANSPORTATION SYSTEM\n"
        "- DAY 3: EXPERIENCE THE NEW YORK METROPOLITAN TRANSPORTATION SYSTEM\n"
        "- DAY 4: VISIT THE CATHEDRAL OF ST. GEORGE AND THE NEW YORK METROPOLITAN TRANSPORTATION SYSTEM\n"
        "- DAY 5: VISIT THE NEW YORK METROPOLITAN TRANSPORTATION SYSTEM\n" + DAYS + "\n- DAY 12: VISIT THE NEW YORK",
    ),
    "1bce1fe4cd98536a8698898d": (
        2416,
        "CITY OF NEW YORK, NEW YORK, USA\n- DAY 1: ARRIVE AT NEW YORK CITY\n"
        "- DAY 2: VISIT THE STATUE OF LIBERTY AND THE NEW YORK METROPOLITAN TRANSPORTATION SYSTEM\n"
        "- DAY 3: EXPERIENCE THE NEW YORK METROPOLITAN TRANSPORTATION SYSTEM\n"
        "- DAY 4: VISIT THE CATHEDRAL OF ST. GEORGE\n- DAY 5: VISIT THE NEW YORK PUBLIC LIBRARY\n"
        + DAYS
        + "\n- DAY 12: VISIT THE NEW YORK METROPOLITAN TRANSPORTATION SYSTEM\n- DAY 13: VISIT THE",
    ),
    "36dc40a3ae20821619fb1113": (
        1477,
        "پیامه\u200cهای پیچیده\u200cایی برای Yoda در یک سطح دیگر\n\n" + "یا دیگر سطح، " * 43 + "یا دیگر سط",
    ),
    "07e5d9919e1b651240860e57": (
        3494,
        "Hier ist ein Beispiel für eine Email, die mit der deutschen Übersetzung beginnt:\n\n"
        '"Du machst eine Fehle nicht, um unsere Käseprodukte zu kaufen, und ich werde dir zeigen, warum."\n\n'
        "Hier sind die 7 Platzhalter mit den deutschen Übersetzungsmuster:\n\n"
        "[Subject] - [Your mistake not to buy our cheese products, and I'm going to show you why.]\n"
        + "\n".join(
            f"[Your {field}] - [Your {field}]"
            for field in ("name", "email address", "phone number", "address", "city", "state", "zip code", "country")
        ),
    ),
    "9b5cbebd07d30e4633ccc42e": (218, "[italy]"),
}
PROCESSES, REPEATS = 2, 3  # each process scores every response REPEATS times

CHILD = """
import json, sys
from fairkv.core import data, metrics

records = {record.key: record for record in data.load_records("sys_ifeval_shuffled")}
responses = json.load(sys.stdin)
print(json.dumps({cell: [metrics.benign_scores(records[key], text) for _ in range(REPEATS)]
                  for cell, (key, text) in responses.items()}))
"""


def test_the_responses_are_those_of_their_records():
    records = {record.key: record for record in data.load_records("sys_ifeval_shuffled")}
    for key, _ in RESPONSES.values():
        assert {"language:response_language", "change_case:english_capital", "change_case:english_lowercase"} & set(
            records[key].instruction_id_list
        )


def test_a_response_scores_the_same_in_fresh_processes():
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD.replace("REPEATS", str(REPEATS))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": str(number)},  # each its own hash order too
        )
        for number in range(PROCESSES)
    ]
    outputs = [child.communicate(json.dumps(RESPONSES), timeout=120) for child in children]
    for child, (_, stderr) in zip(children, outputs):
        assert child.returncode == 0, stderr
    scores = [json.loads(stdout) for stdout, _ in outputs]
    differ = {}
    for cell in RESPONSES:
        seen = {json.dumps([s["strict_list"], s["loose_list"]]) for process in scores for s in process[cell]}
        if len({json.dumps(s, sort_keys=True) for process in scores for s in process[cell]}) > 1:
            differ[cell] = sorted(seen)
    assert differ == {}, f"responses scored differently by {PROCESSES} processes (strict, loose outcomes): {differ}"


def test_rescore_rewrites_only_the_rows_whose_scores_change(tmp_path):
    """``fairkv.runs.rescore`` re-scores benign rows from their responses: a row whose stored score is off (here, a
    prompt-level pass recorded for a response that fails) is rewritten and reported as a flip, an attack row and a
    benign row scored right keep their bytes, and a second pass finds nothing to change."""
    record = data.load_records("sys_ifeval_shuffled")[0]
    right = metrics.benign_scores(record, "hello")
    assert right["prompt_strict"] == 0.0
    base = {"dataset": "sys_ifeval_shuffled", "key": record.key, "response": "hello", "versions": {"code": "x"}}
    rows = [
        {**base, "cell_id": "benign-right", "query": "benign", **right},
        {**base, "cell_id": "benign-off", "query": "benign", **right, "prompt_strict": 1.0},
        {**base, "cell_id": "attack", "query": "attack", "prompt_strict": 1.0},
    ]
    store = ResultsStore(tmp_path / "rows.jsonl")
    store.append(rows)
    before = store.path.read_text().splitlines()
    report = rescore.rescore(store.path, say=lambda text: None)
    assert report["rescored"] == 2 and report["changed"] == ["benign-off"] and report["prompt_flips"] == ["benign-off"]
    after = store.path.read_text().splitlines()
    assert after[0] == before[0] and after[2] == before[2] and after[1] != before[1]
    assert store.rows()["benign-off"] == {**rows[1], "prompt_strict": 0.0, "schema": 1}
    assert rescore.rescore(store.path, say=lambda text: None)["changed"] == []
