"""The needle indexes (Hyperscan, Aho-Corasick DFA and NFA, the pure `bytes.find` sweeps) find
the same matches in real log bytes, and a scan gives the same diagnosis whichever one runs."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from diagnose.knowledge.loaded import Knowledge
from diagnose.match import candidates
from diagnose.match.candidates import needle_map
from diagnose.outputs.json_report import render
from diagnose.pipeline.scan import scan_paths
from diagnose.search.needles import AhoCorasickIndex, FindIndex, HyperscanIndex, make_index

hyperscan = pytest.importorskip("hyperscan", reason="no hyperscan wheel for this platform")

ROOT = Path(__file__).resolve().parent.parent
LOGS = sorted((ROOT / "fixtures" / "logs").glob("*/*.log"))


@pytest.fixture(scope="module")
def needles() -> list[bytes]:
    k = Knowledge.load()
    shared = needle_map(k.rules.rules, k.profiles.markers)
    return [n.encode("utf-8") for n in shared.by_needle]


@pytest.fixture(scope="module")
def real_bytes() -> bytes:
    return b"".join(p.read_bytes() for p in LOGS)


def _as_set(matches: list[tuple[int, ...]]) -> set[tuple[int, int]]:
    return {(m[0], m[1]) for m in matches}


def _by_end(matches: list[tuple[int, ...]], lens: list[int]) -> list[int]:
    return [m[1] + lens[m[0]] for m in matches]


def test_every_index_finds_the_same_matches_in_real_logs(needles: list[bytes], real_bytes: bytes) -> None:
    hs = HyperscanIndex(needles).find(real_bytes)
    dfa = AhoCorasickIndex(needles).find(real_bytes)
    nfa = AhoCorasickIndex(needles, fast_build=True).find(real_bytes)
    pure = FindIndex(needles).find(real_bytes)
    assert len(hs) > 5_000  # the fixtures' logs hold many needles: a real comparison
    assert _as_set(hs) == _as_set(dfa) == _as_set(nfa) == _as_set(pure)
    assert len(hs) == len(dfa)  # overlapping occurrences each once, in every index
    lens = [len(n) for n in needles]
    ends = _by_end(hs, lens)
    assert ends == sorted(ends)  # by end offset, as the Aho-Corasick automaton reports them
    assert all(real_bytes[s:e] == needles[i] for i, s, e in hs)


def test_the_presence_test_tells_the_needles_every_index_finds(
    needles: list[bytes], real_bytes: bytes
) -> None:
    """Hyperscan's presence test (each needle once) names exactly the needles found, on every
    fixture log's bytes and on their concatenation; nested and overlapping needles too."""
    hs = HyperscanIndex(needles, first_only=True)
    for data in [real_bytes, *(p.read_bytes() for p in LOGS)]:
        assert hs.present(data) == {m[0] for m in FindIndex(needles).find(data)}
    once = HyperscanIndex([b"model loaded", b"main: model loaded", b"aa", b"zz"], first_only=True)
    assert once.present(b"x main: model loaded\naaa\n") == {0, 1, 2}
    assert len(once.find(b"aaaa aa")) == 1  # each needle told once


def test_overlapping_and_nested_needles() -> None:
    needles = [b"model loaded", b"main: model loaded", b"aa"]
    text = b"x main: model loaded\naaa\n"
    assert (
        _as_set(HyperscanIndex(needles).find(text))
        == _as_set(FindIndex(needles).find(text))
        == {
            (1, 2),
            (0, 8),
            (2, 21),
            (2, 22),
        }
    )


def test_long_haul_index_is_hyperscan_and_a_quick_build_is_not(needles: list[bytes]) -> None:
    assert make_index(needles, blocks=True).name == "hyperscan"
    assert make_index(needles, fast_build=True, blocks=True).name == "aho-corasick"
    assert make_index(needles).name == "aho-corasick"  # a line at a time: a call's cost decides


def test_without_hyperscan_the_long_haul_is_aho_corasick(
    needles: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DIAGNOSE_NO_HYPERSCAN", "1")
    assert make_index(needles, blocks=True).name == "aho-corasick"


def test_threads_scan_one_index_at_once(needles: list[bytes], real_bytes: bytes) -> None:
    """The binding lets go of the GIL while scanning: each thread needs its own scratch space
    (with one shared, concurrent scans fail with ScratchInUseError)."""
    index = HyperscanIndex(needles)
    want = index.find(real_bytes)
    errors: list[BaseException] = []
    results: list[bool] = []

    def work() -> None:
        try:
            for _ in range(5):
                results.append(index.find(real_bytes) == want)
        except BaseException as e:  # reported below, in the test thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [True] * 20


def _diagnoses(monkeypatch: pytest.MonkeyPatch, no_hyperscan: bool) -> list[str]:
    # every index a DFA from the first byte (a long log's case), on each fixture log
    monkeypatch.setattr(candidates, "DFA_AFTER", 0)
    monkeypatch.setattr(candidates, "_MAPS", [])
    if no_hyperscan:
        monkeypatch.setenv("DIAGNOSE_NO_HYPERSCAN", "1")
    else:
        monkeypatch.delenv("DIAGNOSE_NO_HYPERSCAN", raising=False)
    k = Knowledge.load()
    out = []
    for p in LOGS:
        doc = json.loads(render(scan_paths([str(p)], k)))
        doc.pop("durations", None)
        out.append(json.dumps(doc, sort_keys=True))
    return out


def test_a_scan_says_the_same_with_hyperscan_or_aho_corasick(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        ac = _diagnoses(m, no_hyperscan=True)
    with monkeypatch.context() as m:
        hs = _diagnoses(m, no_hyperscan=False)
    assert len(hs) == len(LOGS) > 50
    assert hs == ac


def test_every_index_tells_the_same_needles_present(needles: list[bytes], real_bytes: bytes) -> None:
    """`present` (a line's literal test) names the needles `find` finds, in every index."""
    lines = real_bytes.split(b"\n")[::50]
    indexes = [
        HyperscanIndex(needles),
        AhoCorasickIndex(needles),
        AhoCorasickIndex(needles, True),
        FindIndex(needles),
    ]
    for line in lines:
        want = {m[0] for m in FindIndex(needles).find(line)}
        assert all(ix.present(line) == want for ix in indexes), line[:100]
