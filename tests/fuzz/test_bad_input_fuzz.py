"""Bad input never hurts: generated bad values for every CLI flag and every file field.

Each example runs one command (in process, as the shell would: ``main(argv)``) against a
seeded SQLite store with one bad value among good ones, and asserts what a user must see:

* exit status 2;
* exactly one line on stderr, starting ``gpu-pool``, naming the field (or the flag), no
  traceback, shorter than 600 characters however long the value was;
* no secret echoed (a password in a store URL, the seeded team's webhook secret);
* the store's full dump (every row of every table) unchanged, and no new file made.

The Python API (``parse_request``, ``GpuSSHOperator``) gets the same treatment: a bad value
is a :class:`SpecError` naming the field, never another exception.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_pool.cli import main
from gpu_pool.errors import SpecError
from gpu_pool.spec import parse_node, parse_quota, parse_request

DATA = Path(__file__).resolve().parents[1] / "data"
NODES_CSV = str(DATA / "openb_nodes_excerpt.csv")
PODS_CSV = str(DATA / "openb_pods_excerpt.csv")
SECRET = "S3cr3t-hunter2"  # never in any message
EXAMPLES = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

FLEET = """
nodes:
  - {name: n1, zone: z1, gpu_model: A100, gpus: 8, cpu: 64, memory: 512GiB}
  - {name: n2, zone: z2, gpu_model: T4, gpus: 4, cpu: 32, memory: 128GiB}
"""


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in a stable order: the whole store."""
    with sqlite3.connect(path) as db:
        tables = [t for (t,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: sorted(db.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr)
                for t in tables}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "store.db"
    url = f"sqlite:///{path}"
    fleet = folder / "fleet.yaml"
    fleet.write_text(FLEET)
    for argv in (["db", "migrate"], ["team", "add", "nlp", "--email", "nlp@example.com"],
                 ["team", "add", "vision", "--webhook",
                  f"https://hooks.example.com/T0/{SECRET}"],
                 ["nodes", "import", str(fleet)],
                 ["quota", "set", "--team", "nlp", "--purpose", "training", "--gpus", "8",
                  "--expires", "2099-01-01"],
                 ["submit", "--name", "held", "--team", "nlp", "--gpus", "2"],
                 ["place"],
                 ["submit", "--name", "waiting", "--team", "nlp", "--gpus", "8"]):
        assert main(["--db", url, *argv]) == 0, argv
    yield url, path


@pytest.fixture
def refused(seeded: tuple[str, Path], capsys: pytest.CaptureFixture[str]
            ) -> Callable[[list[str], tuple[str, ...]], str]:
    """Run ``argv`` on the seeded store; check the refusal; return its line."""
    url, path = seeded
    before = dump(path)

    def files() -> set[Path]:
        # SQLite's -wal/-shm come and go with connections (an earlier example's, closed by
        # the garbage collector at any time): not files a command made.
        return {p for p in path.parent.iterdir()
                if not p.name.endswith(("-wal", "-shm", "-journal"))}

    files_before = files()

    def run(argv: list[str], names: tuple[str, ...], db: str | None = url) -> str:
        capsys.readouterr()
        code = main(([] if db is None else ["--db", db]) + argv)
        out, err = capsys.readouterr()
        assert code == 2, (argv, out, err)
        lines = err.splitlines()
        assert len(lines) == 1 and err.endswith("\n"), (argv, err)
        line = lines[0]
        assert line.startswith("gpu-pool"), line
        assert "Traceback" not in err and len(line) < 600, line
        assert any(n in line for n in names), (names, line)
        assert SECRET not in err + out
        assert dump(path) == before, f"{argv} changed the store"
        assert files() == files_before, f"{argv} made a file"
        return line

    return run


# -- bad values -----------------------------------------------------------------------------

def _texts(alphabet: str, min_size: int = 1, max_size: int = 12) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=min_size, max_size=max_size)


GARBAGE = st.one_of(
    _texts("abcxyz!?#", 1, 8),
    st.sampled_from(["", " ", "nan", "inf", "-inf", "NaN", "1e400", "-1e400", "0x10", "1,5",
                     "\x00", "\u202e1", "1\n2", "\udcff"]),
    st.integers(min_value=31, max_value=400).map(lambda n: "9" * n),
    st.integers(min_value=300, max_value=10_000).map(lambda n: "x" * n),
)


def bad_int(low: int, high: int, fractions: bool = True) -> st.SearchStrategy[str]:
    parts = [GARBAGE, st.integers(max_value=low - 1).map(str),
             st.integers(min_value=high + 1).map(str),
             st.integers(min_value=high * 10 + 10, max_value=10**40).map(lambda n: f"{n:.3e}")]
    if fractions:
        parts.append(st.floats(min_value=low + 0.01, max_value=min(high, 10**6) - 0.01)
                     .filter(lambda x: x != int(x)).map(repr))
    return st.one_of(*parts)


def bad_number(low: float, high: float) -> st.SearchStrategy[str]:
    return st.one_of(GARBAGE, st.floats(max_value=low, exclude_max=True).map(repr),
                     st.floats(min_value=high, exclude_min=True, allow_infinity=True).map(repr))


BAD_DURATION = st.one_of(
    GARBAGE.filter(lambda t: t not in ("inf",)),
    st.sampled_from(["0", "-1h", "0s", "367d", "9000h", "1e20", "99999999999d", "1h-", "h"]),
    st.integers(min_value=31_622_401, max_value=10**30).map(str),
)
BAD_MEMORY = st.one_of(GARBAGE, st.sampled_from(["-1", "2PiB", "1025TiB", "1.5.2G", "12X",
                                                 "-16GiB", "1e9T"]),
                       st.integers(min_value=2**30 + 1).map(str))
BAD_NAME = st.one_of(_texts(" !$%^&*()[]{}'\"\\|;<>,`~", 1, 6),
                     st.sampled_from(["", "-x", "a b", "é", "x" * 251, "a\tb", "."]),
                     st.integers(min_value=251, max_value=5000).map(lambda n: "n" * n))
BAD_TIME = st.one_of(GARBAGE, st.sampled_from(["1999-12-31", "2200-01-01", "9999-12-31",
                                               "0001-01-01", "2026-13-01", "2026-02-30",
                                               "tomorrow", "2026-12-01T25:00"]))
BAD_TEXT = st.one_of(st.sampled_from(["", "   ", "a\nb", "tab\there", "\x07bell", "\udcff"]),
                     st.integers(min_value=501, max_value=10_000).map(lambda n: "r" * n))
BAD_WORD = _texts("abcdefghijklmnopqrstuvwxyz", 1, 10).filter(
    lambda w: w not in {"training", "inference", "pretraining", "critical", "high", "normal",
                        "low", "batch", "success", "failed", "timed_out", "preempted",
                        "reclaimed", "cancelled", "engine", "random", "firstfit", "bestfit",
                        "fgd", "fifo"})

SUBMIT = ["submit", "--name", "fz", "--team", "nlp"]
QUOTA = ["quota", "set", "--team", "nlp", "--purpose", "inference", "--gpus", "4",
         "--expires", "2099-01-01"]
PACKING = ["simulate", "packing", "--nodes", NODES_CSV, "--pods", PODS_CSV, "--policy",
           "bestfit", "--seeds", "1"]
REPLAY = ["simulate", "replay", "--nodes", NODES_CSV, "--pods", PODS_CSV, "--policy", "fifo"]

# (what, base argv, flag, strategy of bad values, names the message may use for the field)
FLAGS: list[tuple[str, list[str], str, st.SearchStrategy[str], tuple[str, ...]]] = [
    ("submit gpus", SUBMIT, "--gpus", bad_int(1, 8), ("gpus",)),
    ("submit share", SUBMIT, "--share", bad_int(1, 999), ("gpu_share",)),
    ("submit nodes", SUBMIT + ["--gpus-per-node", "1"], "--nodes", bad_int(1, 2), ("nodes",)),
    ("submit gpus per node", SUBMIT + ["--nodes", "2"], "--gpus-per-node", bad_int(1, 4),
     ("gpus_per_node",)),
    ("submit models", SUBMIT, "--models", BAD_WORD.filter(lambda w: w.upper() not in {
        "T4", "A10", "L4", "P100", "V100", "A100", "H100", "G2", "G3", "A10G"}),
     ("gpu_models",)),
    ("submit gpu memory", SUBMIT, "--min-gpu-memory", BAD_MEMORY, ("min_gpu_memory",)),
    ("submit cpu", SUBMIT, "--cpu", st.one_of(GARBAGE, st.sampled_from(
        ["-1", "100001", "1e9", "5000000000m", "-5m", "m", "1.5m"])), ("cpu",)),
    ("submit memory", SUBMIT, "--memory", BAD_MEMORY, ("memory",)),
    ("submit purpose", SUBMIT, "--purpose", BAD_WORD, ("purpose",)),
    ("submit priority", SUBMIT, "--priority", BAD_WORD, ("priority",)),
    ("submit dataset", SUBMIT, "--dataset", BAD_TEXT.filter(lambda t: " " in t or not t.strip()
                                                            or len(t) > 2048 or
                                                            not t.isprintable()),
     ("dataset",)),
    ("submit dataset zone", SUBMIT + ["--dataset", "s3://x"], "--dataset-zone", BAD_NAME,
     ("dataset_zone",)),
    ("submit dataset size", SUBMIT + ["--dataset", "s3://x"], "--dataset-size-gib",
     bad_number(0, 1e9), ("dataset_size_gib",)),
    ("submit time limit", SUBMIT, "--time-limit", BAD_DURATION, ("time_limit",)),
    ("submit estimate past the limit", SUBMIT + ["--time-limit", "1h"], "--estimated-runtime",
     st.sampled_from(["2h", "61m", "1d", "3601"]), ("estimated_runtime",)),
    ("submit name", ["submit", "--team", "nlp"], "--name",
     st.one_of(BAD_NAME, st.just("held")), ("name",)),
    ("submit team", ["submit", "--name", "fz"], "--team",
     st.one_of(BAD_NAME, st.just("ghosts")), ("team",)),
    ("team name", ["team", "add"], "", BAD_NAME, ("name",)),
    ("team email", ["team", "add", "research"], "--email",
     st.one_of(BAD_NAME, st.sampled_from(["a@b", "@x.org", "a b@c.org", "x" * 300 + "@a.org"])),
     ("notify_email",)),
    ("team webhook", ["team", "add", "research"], "--webhook",
     st.sampled_from(["ftp://x", "file://relative", "conn:", "hooks", "http://a b",
                      "https://x/" + "p" * 3000, "http://\x07"]), ("notify_webhook",)),
    ("drain name", ["nodes", "drain"], "", BAD_NAME, ("name",)),
    ("drain reason", ["nodes", "drain", "n2"], "--reason", BAD_TEXT, ("reason",)),
    ("quota gpus", QUOTA[:6] + QUOTA[8:], "--gpus", bad_int(0, 1_000_000), ("gpus",)),
    ("quota purpose", ["quota", "set", "--team", "nlp", "--gpus", "4", "--expires",
                       "2099-01-01"], "--purpose", BAD_WORD, ("purpose",)),
    ("quota model", QUOTA, "--model", BAD_WORD.filter(lambda w: w not in ("any", "t4", "l4")),
     ("gpu_model",)),
    ("quota start", QUOTA, "--from", BAD_TIME, ("valid_from",)),
    ("quota end", QUOTA[:8], "--expires", st.one_of(BAD_TIME, st.just("2001-01-01")),
     ("expires_at",)),
    ("quota borrow", QUOTA, "--borrow", bad_int(0, 1_000_000), ("borrow_limit_gpus",)),
    ("quota budget", QUOTA, "--budget", bad_number(0, 1e9), ("gpu_hour_budget",)),
    ("quota team", ["quota", "set", "--purpose", "training", "--gpus", "1", "--expires",
                    "2099-01-01"], "--team", st.one_of(BAD_NAME, st.just("ghosts")), ("team",)),
    ("queue team", ["queue"], "--team", BAD_NAME, ("team",)),
    ("why name", ["why"], "", BAD_NAME, ("name",)),
    ("release outcome", ["release", "held"], "--outcome", BAD_WORD, ("outcome",)),
    ("release reason", ["release", "held"], "--reason", BAD_TEXT, ("reason",)),
    ("packing seeds", PACKING[:-2], "--seeds", st.one_of(GARBAGE.filter(
        lambda t: t.strip() != "1,5" and not t.isdigit()), st.sampled_from(
        ["1-4000000000", "5-1", "-3", "1-2001", "4294967296"])), ("seeds",)),
    ("packing batch", PACKING, "--batch", bad_int(1, 100_000), ("batch",)),
    ("packing policy", PACKING[:6] + PACKING[8:], "--policy", BAD_WORD, ("policy",)),
    ("packing nodes file", ["simulate", "packing", "--pods", PODS_CSV, "--policy", "bestfit",
                            "--seeds", "1"], "--nodes",
     st.sampled_from(["/nonexistent/nodes.csv", "/", "/dev/null/x", "no\x00pe.csv"]),
     ("nodes",)),
    ("replay heartbeat", REPLAY, "--heartbeat", bad_number(0, 86_400).filter(
        lambda v: v != "0.0"), ("heartbeat",)),
    ("replay sample", REPLAY, "--sample", bad_number(0, 1), ("sample",)),
    ("replay seed", REPLAY, "--seed", bad_int(0, 2**32 - 1), ("seed",)),
    ("replay fleet fraction", REPLAY, "--fleet-fraction", bad_number(0, 1),
     ("fleet-fraction",)),
    ("replay max cycle tasks", REPLAY, "--max-cycle-tasks", bad_int(1, 1_000_000),
     ("max-cycle-tasks",)),
    ("replay reserve after", REPLAY, "--reserve-after", bad_number(0, 31_622_400),
     ("reserve-after",)),
    ("replay max reservations", REPLAY, "--max-reservations", bad_int(0, 10_000),
     ("max-reservations",)),
    ("alerts smtp port", ["alerts", "run", "--smtp-host", "127.0.0.1"], "--smtp-port",
     bad_int(1, 65535), ("smtp-port",)),
    ("alerts smtp host", ["alerts", "run"], "--smtp-host", BAD_TEXT, ("smtp-host",)),
    ("alerts config", ["alerts", "run", "--dry-run"], "--config",
     st.sampled_from(["{", "[]", "1", '{"alert_days": [0]}', '{"alert_days": [1e999]}',
                      '{"idle_minutes": 99999999999}', '{"bogus": 1}', "[" * 5000 + "]" * 5000,
                      '{"alert_days": "7"}']), ("gpu_pool_ops",)),
    ("ledger day", ["ledger", "export"], "--day", st.one_of(BAD_TIME, st.just("9999-12-31")),
     ("--day",)),
    ("report month", ["report"], "--month", st.sampled_from(
        ["2026", "2026-13", "9999-12", "1999-12", "2026-1", "x", "2026-12-01"]), ("--month",)),
    ("report out", ["report", "--month", "2026-11"], "--out",
     st.sampled_from(["/etc/hostname/reports", "/proc/1/nope", "/dev/null"]), ("out",)),
    ("demo port", ["demo", "--airflow"], "--port", bad_int(1, 65535), ("port",)),
    ("demo timeout", ["demo", "--airflow"], "--timeout", bad_number(0, 86_400).filter(
        lambda v: v != "0.0"), ("timeout",)),
    ("demo host", ["demo", "--airflow"], "--host", st.one_of(BAD_NAME, st.just("localhost")),
     ("host",)),
]


@pytest.mark.parametrize(("base", "flag", "values", "names"), [c[1:] for c in FLAGS],
                         ids=[c[0] for c in FLAGS])
@EXAMPLES
@given(data=st.data())
def test_every_flag_refuses_a_bad_value_in_one_line_and_changes_nothing(
        refused: Callable[..., str], base: list[str], flag: str,
        values: st.SearchStrategy[str], names: tuple[str, ...], data: st.DataObject) -> None:
    value = data.draw(values)
    # --flag=value keeps a value starting with '-' a value; a positional goes last.
    argv = [*base, f"{flag}={value}"] if flag else [*base, "--", value]
    refused(argv, names + ((flag,) if flag else ()))


def test_store_urls_must_name_an_existing_store(refused: Callable[..., str],
                                               tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "gpu_pool.db"
    for db, names in ((f"sqlite:///{missing}", ("db",)), ("", ("db",)), ("   ", ("db",)),
                      ("nosuchscheme://x", ("db",)),
                      (f"mysql://root:{SECRET}@localhost/x", ("db",))):
        line = refused(["nodes", "list"], names, db=db)
        assert SECRET not in line
    assert not missing.parent.exists(), "a typo in a URL made a folder"


@pytest.mark.parametrize("command", [["nodes", "import"], ["quota", "import"],
                                     ["submit", "--file"]])
def test_input_files_are_checked_before_any_work(refused: Callable[..., str], tmp_path: Path,
                                                 command: list[str]) -> None:
    binary = tmp_path / "latin1.yaml"
    binary.write_bytes(b"nodes:\n  - {name: caf\xe9}\n")
    big = tmp_path / "big.yaml"
    with big.open("wb") as out:  # sparse: 65 MiB on paper, nothing on disk
        out.truncate(65 * 1024 * 1024)
    for path, expected in ((tmp_path / "missing.yaml", "an existing, readable file"),
                           (tmp_path, "a regular file"),
                           (binary, "UTF-8 text (byte 0xe9 on line 2"),
                           (big, "a file of at most 64 MiB")):
        line = refused([*command, str(path)], ("file",))
        assert expected in line, line


# -- files: one bad field among good ones ----------------------------------------------------

GOOD_REQUEST = {"name": "filed", "team": "nlp", "gpus": 1}
GOOD_NODE = {"name": "n9", "gpu_model": "T4", "gpus": 2, "cpu": 8, "memory": "32GiB"}
GOOD_QUOTA = {"team": "vision", "purpose": "training", "gpus": 2,
              "valid_from": "2026-01-01", "expires_at": "2099-01-01"}
YAML_VALUES = st.one_of(
    st.integers(min_value=10**20, max_value=10**60), st.integers(max_value=-1),
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: x != x or abs(x) > 1e12),
    st.text(max_size=3).map(lambda t: f"bad {t}"), st.lists(st.integers(), min_size=1,
                                                            max_size=3),
    st.dictionaries(st.text("ab", min_size=1, max_size=2), st.integers(), min_size=1,
                    max_size=2),
    st.just("x" * 20_000))

FILE_FIELDS = [
    ("request", GOOD_REQUEST, ["gpus", "gpu_share", "nodes", "gpus_per_node", "cpu", "memory",
                               "min_gpu_memory", "time_limit", "estimated_runtime", "purpose",
                               "priority", "dataset_size_gib", "submitted_at", "team", "name"]),
    ("node", GOOD_NODE, ["gpus", "gpu_model", "cpu", "memory", "gpu_memory", "bandwidth_mb_s",
                         "zone", "tier", "state", "labels", "name"]),
    ("quota", GOOD_QUOTA, ["gpus", "borrow_limit_gpus", "gpu_hour_budget", "valid_from",
                           "expires_at", "purpose", "gpu_model", "team"]),
]


def _file_for(kind: str, items: list[dict[str, Any]], folder: Path) -> tuple[list[str], Path]:
    path = folder / f"{kind}s.yaml"
    if kind == "request":
        path.write_text(yaml.safe_dump(items))
        return ["submit", "--file", str(path)], path
    key = "nodes" if kind == "node" else "quotas"
    path.write_text(yaml.safe_dump({key: items}))
    return ["nodes" if kind == "node" else "quota", "import", str(path)], path


@pytest.mark.parametrize(("kind", "good", "fields"), FILE_FIELDS, ids=[f[0] for f in FILE_FIELDS])
@EXAMPLES
@given(data=st.data())
def test_a_file_with_one_bad_field_writes_nothing(refused: Callable[..., str], tmp_path: Path,
                                                  kind: str, good: dict[str, Any],
                                                  fields: list[str], data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(fields))
    value = data.draw(YAML_VALUES)
    items = [dict(good, name=f"{kind}-ok") if "name" in good else dict(good, purpose="inference"),
             {**good, field: value}]
    argv, _ = _file_for(kind, items, tmp_path)
    line = refused(argv, (field, "#2"))
    assert f"{kind} #2" in line, line  # the first item, good, was not written either


def test_a_refused_request_file_leaves_the_store_as_it_was(refused: Callable[..., str],
                                                           tmp_path: Path) -> None:
    """The issue's case: the third request's name is taken; the two before it are not kept."""
    items = [dict(GOOD_REQUEST, name="f1"), dict(GOOD_REQUEST, name="f2"),
             dict(GOOD_REQUEST, name="held")]
    argv, _ = _file_for("request", items, tmp_path)
    line = refused(argv, ("name",))
    assert "request #3: name: got 'held'" in line


# -- the Python API ----------------------------------------------------------------------------

ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**30,
                                                            max_value=10**30),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                      st.lists(st.integers(), max_size=3), st.binary(max_size=4),
                      st.timedeltas(), st.datetimes())
REQUEST_FIELDS = ["gpus", "gpu_share", "nodes", "gpus_per_node", "gpu_models",
                  "min_gpu_memory", "cpu", "memory", "purpose", "priority", "dataset",
                  "dataset_size_gib", "data_ready", "time_limit", "estimated_runtime",
                  "preemptible", "submitted_at"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(field=st.sampled_from(REQUEST_FIELDS), value=ANY_VALUE)
def test_parse_request_gives_a_request_or_a_spec_error_never_another_exception(
        field: str, value: Any) -> None:
    fields = {"name": "r", "team": "nlp", field: value}
    if field in ("dataset_size_gib",):
        fields["dataset"] = "s3://x"
    try:
        parse_request(fields)
    except SpecError as error:
        assert len(str(error)) < 600 and "\n" not in str(error)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=st.data())
def test_parse_node_and_quota_give_an_object_or_a_spec_error(data: st.DataObject) -> None:
    node_field = data.draw(st.sampled_from(["gpus", "cpu", "memory", "gpu_memory",
                                            "bandwidth_mb_s", "labels", "state", "tier"]))
    with contextlib.suppress(SpecError):
        parse_node({**GOOD_NODE, node_field: data.draw(ANY_VALUE)})
    quota_field = data.draw(st.sampled_from(["gpus", "borrow_limit_gpus", "gpu_hour_budget",
                                             "valid_from", "expires_at", "gpu_model"]))
    with contextlib.suppress(SpecError):
        parse_quota({**GOOD_QUOTA, quota_field: data.draw(ANY_VALUE)})


@pytest.mark.parametrize(("field", "value", "message"), [
    ("time_limit", 1e20, "time_limit: got 1e+20; expected a positive duration"),
    ("memory", "9" * 30, "memory: got '999999999999999999999999999999'; expected a size"),
    ("gpus", 10**40, "gpus: got 10000000000000000000000000000000000000000; expected a whole"),
    ("cpu", float("inf"), "cpu: got inf; expected cores as a number"),
    ("dataset_size_gib", 1e300, "dataset_size_gib: got 1e+300; expected a number at least 0 "
                                "and at most 1,000,000,000"),
])
def test_the_operator_refuses_an_overflowing_value_at_parse_time(field: str, value: Any,
                                                                  message: str) -> None:
    from gpu_pool.operators import GpuSSHOperator

    extra = {"dataset": "s3://x"} if field == "dataset_size_gib" else {}
    with pytest.raises(SpecError) as refused:
        GpuSSHOperator(task_id="train", command="true", team="nlp", **{field: value}, **extra)
    assert str(refused.value).startswith(f"task 'train': {message}"), str(refused.value)
