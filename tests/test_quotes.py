"""Each number the hand-written prose quotes is tied to the one cell it quotes (issue 53, item 3).

The prose: the README outside its generated section, ``docs/`` but for its generated pages, ``notebooks/README.md`` and
the notebooks' markdown. A number there that reports a result (a time, a count, a share, a rate, a token count, a
decimal that is no setting) must sit inside a ``Quote``: the page's words around it and the one cell of a benchmark's
printed output, or the one value of the code, that it quotes. A number that states a requirement or an assumption
rather than a measurement is listed in ``GIVEN`` with its reason. Anything else fails, naming the page and the number,
so a stale number put back into prose fails here."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import fairkv.studies
from fairkv.core import data, metrics, progress, prompts
from fairkv.report import readme
from fairkv.report.notebooks import numbered
from fairkv.runs import tolerance

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _flat(text: str) -> str:
    """Whitespace (line breaks of wrapped prose) made single spaces."""
    return re.sub(r"\s+", " ", text)


@dataclass(frozen=True)
class Quote:
    """``said`` (a regex with one group: the number as the page writes it) on ``page``, and the cell it quotes:
    ``cell``'s group in the file ``source``, or what ``value`` returns."""

    page: str
    said: str
    source: Path | None = None
    cell: str = ""
    value: Callable[[], str] | None = None

    def quoted(self) -> str:
        if self.value is not None:
            return self.value()
        found = re.search(self.cell, _flat(self.source.read_text()))
        assert found, f"{self.source.name} has no cell {self.cell!r}"
        return found.group(1)


def _estimate_from_empty_store() -> str:
    """What ``fairkv reproduce`` announces for the cpu profile from an empty store, as the README writes it."""
    _, minutes = fairkv.studies.expected_minutes("cpu", [nb.name[:2] for nb in numbered()])
    return progress.duration(60 * round(sum(minutes.values())))


def _ratio(source: Path, numerator: str, denominator: str) -> str:
    """Two cells of ``source`` (each a regex's group, the first match) divided, as a whole number."""
    text = _flat(source.read_text())
    return f"{float(re.search(numerator, text).group(1)) / float(re.search(denominator, text).group(1)):.0f}"


def _refusal_against_the_template() -> str:
    templates = data.load_defense_templates()
    return f"{metrics.leakage(templates['standard_defense'], prompts.SCRIPTED_REPLY):.2f}"


CAPPED = "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"  # the capped run's command in emulated_bfloat16.txt
CI_RUN, ESTIMATE = (
    RESULTS / "ci_run_avx512_bf16.txt",
    RESULTS / "scaleout_estimate_paper.txt",
)  # the latest CI run measured
QUOTES = (
    Quote(
        "README.md",
        r"the frozen `make reproduce` took (\d+ min \d+ s)",
        CI_RUN,
        r"make reproduce FROZEN=1 took (\d+ min \d+ s)",
    ),
    Quote("README.md", r"`make test` (\d+ min \d+ s)", CI_RUN, r"make test took (\d+ min \d+ s)"),
    Quote("README.md", r"On a 2-core CPU with ([\w-]+), a fresh clone", CI_RUN, r"CPU with ([\w-]+)"),
    Quote("README.md", r"from an empty results store about (\d+ h \d+ min)", value=_estimate_from_empty_store),
    Quote("docs/gpu.md", r"([\d,]+) distinct cells", ESTIMATE, r"([\d,]+) distinct cells"),
    Quote("docs/gpu.md", r"at most ([\d,]+) generated tokens", ESTIMATE, r"at most ([\d,]+) generated tokens"),
    Quote("docs/gpu.md", r"at most (\d+) GPU-hours on one GPU", ESTIMATE, r"at 1000 tok/s [^:]*: (\d+) GPU-hours"),
    Quote(
        "docs/gpu.md", r"attack answers average ([\d.]+) new tokens", ESTIMATE, r"attack: [\d,]+ answers, ([\d.]+) new"
    ),
    Quote("docs/gpu.md", r"benign answers ([\d.]+)\.", ESTIMATE, r"benign: [\d,]+ answers, ([\d.]+) new"),
    Quote(
        "docs/architecture.md",
        r"issue 49: (\d+) of [\d,]+ rows changed",
        RESULTS / "rescore_langdetect.txt",
        r"re-scored in [\d.]+ s, (\d+) changed",
    ),
    Quote(
        "docs/architecture.md",
        r"issue 49: \d+ of ([\d,]+) rows changed",
        RESULTS / "rescore_langdetect.txt",
        r"(\d+) benign rows re-scored",
    ),
    Quote(
        "docs/architecture.md",
        r"rows changed, (\d+) flipped prompt-level",
        RESULTS / "rescore_langdetect.txt",
        r"(\d+) of them flip prompt-level",
    ),
    Quote(
        "docs/benchmarks.md",
        r"a decoding step's matmul runs at ([\d.]+) GFLOP/s",
        RESULTS / "bfloat16_avx2.txt",
        r"torch.bfloat16: ([\d.]+) GFLOP/s",
    ),
    Quote(
        "docs/benchmarks.md",
        r"GFLOP/s against float32's ([\d.]+),",
        RESULTS / "bfloat16_avx2.txt",
        r"torch.float32: ([\d.]+) GFLOP/s",
    ),
    Quote(
        "docs/benchmarks.md",
        r"Qwen's prefill (\d+) times slower",
        RESULTS / "bfloat16_avx2.txt",
        r"qwen2.5-coder-1.5b, one 100-token prefill: .* \((\d+)\.\dx\)",
    ),
    Quote("docs/reliability.md", r"a span's keep rate within ([\d.]+)", value=lambda: str(tolerance.KEEP_BOUND)),
    Quote(
        "docs/reliability.md",
        r"atlas rows: ([\d.]+) for emulated bfloat16",
        RESULTS / "emulated_bfloat16.txt",
        r"cpu bfloat16 emulated: \d+ identical; a span's keep rate moved by at most ([\d.]+)",
    ),
    Quote(
        "docs/reliability.md",
        r"([\d.]+) for oneDNN's AVX512 kernels",
        RESULTS / "emulated_bfloat16_avx512.txt",
        r"cpu bfloat16 avx512: \d+ identical; a span's keep rate moved by at most ([\d.]+)",
    ),
    *(
        Quote("docs/reliability.md", said, RESULTS / "decode_agreement.txt", cell)
        for said, cell in (
            (r"are: ([\d.]+) and [\d.]+ of attack", r"attack: .*?identical answers \d+ \(([\d.]+)\)"),
            (r"are: [\d.]+ and ([\d.]+) of attack", r"benign: .*?identical answers \d+ \(([\d.]+)\)"),
            (r"([\d.]+) and [\d.]+ read alike", r"attack: .*?identical readings \d+ \(([\d.]+)\)"),
            (r"[\d.]+ and ([\d.]+) read alike", r"benign: .*?identical readings \d+ \(([\d.]+)\)"),
        )
    ),
    *(
        Quote(
            "docs/benchmarks.md",
            said,
            RESULTS / "emulated_bfloat16.txt",
            rf"{CAPPED} .*?cpu {path}: [^$]*?of 16 answers [\d.]+ s \(([\d.]+) tokens/s\)",
        )
        for said, path in (
            (r"16 answers at ([\d.]+) tokens/s emulated", "bfloat16 emulated"),
            (r"([\d.]+) in float32 and", "float32 avx2"),
            (r"([\d.]+) with the bfloat16 fallback", "bfloat16 avx2"),
        )
    ),
    Quote(
        "docs/benchmarks.md",
        r"prefilled (\d+) times faster emulated",
        value=lambda: _ratio(
            RESULTS / "emulated_bfloat16.txt",
            rf"{CAPPED} .*?cpu bfloat16 avx2: 100-token prefill ([\d.]+) s",
            rf"{CAPPED} .*?cpu bfloat16 emulated: 100-token prefill ([\d.]+) s",
        ),
    ),
    Quote(
        "notebooks/03_pitfalls3_4_leakage.ipynb",
        r"against the whole template it scores ROUGE-L recall ([\d.]+)",
        value=_refusal_against_the_template,
    ),
)

# numbers that state a requirement, an assumption or a setting, not a measurement: (page, words around it, why)
GIVEN = (
    ("docs/tests.md", "CI's limit is 90 min", "CI's own limit, not a measurement"),
    ("docs/gpu.md", "16 GB of disk for the weights", "Llama-3.1-8B's size in bfloat16, from the hub"),
    ("docs/gpu.md", "a GPU with 24 GB or more (16 GB of weights", "the requirement that size implies"),
    ("docs/gpu.md", "at 1,000 tok/s of batched decoding", "the rate assumed, stated as an assumption"),
    ("docs/gpu.md", "the file gives 500 and 2,000 tok/s too", "the other rates the estimate assumes"),
    ("docs/reliability.md", "spans of up to 3,000 words", "the fuzzer's setting"),
    ("docs/reliability.md", "the grid ran 0.5 and 0.7", "the ratios a test's grid runs, settings"),
    ("docs/audit.md", "recall above 0.3", "the audit's leak threshold, a setting"),
    ("docs/audit.md", "recall passes 0.3", "the audit's leak threshold, a setting"),
    ("notebooks/03_pitfalls3_4_leakage.ipynb", "ROUGE-L > 0.3", "the leak threshold, a setting"),
    ("notebooks/00_quickstart.ipynb", "ROUGE-L above 0.3", "the leak threshold, a setting"),
    ("notebooks/06_fair_eviction.ipynb", "composite score 0.5 (accuracy gain) + 0.5 (leakage drop)", "the formula"),
)

# not a quantity: versions, model names and sizes, licences, sections, arXiv ids, the confidence level, ratios and
# lambdas (settings), code (fenced or inline)
NOT_QUANTITIES = re.compile(
    r"```.*?```|`[^`\n]*`"
    r"|\d+\.\d+\.\d+|(?:Python|torch|Ray|kvpress|transformers|Llama-|Apache-|GPL-)\s?\d+(?:\.\d+)?"
    r"|\d+(?:\.\d+)?B\b|Qwen2\.5|Sections?\s[\d.\-–, and]+|Appendi(?:x|ces)\s[A-Z\d.\-–, and]+|\d{4}\.\d{5}|95%"
    r"|\b(?:r|lambda|λ)\s?(?:=|<|>|≤|≥|in)\s?\{?(?:[\d.,\s\-–]|and\b)*\d\}?(?:\s?(?:to|-|–)\s?\d(?:\.\d+)?)?"
    r"|\d(?:\.\d+)?\s?<\s?r\s?<\s?\d(?:\.\d+)?|\bpp\. \d+-\d+|\d+-\d+ (?:instruction )?spans|\d{2}-\d{2}",
    flags=re.DOTALL,
)
# a quantity that reports a result: a duration, a size, a rate, a share, a count with thousands, a decimal
QUANTITY = re.compile(
    r"\d+ h \d+ min|\d+ min \d+ s|\d+(?:\.\d+)? ?(?:h|min|s|ms|hours?|GB|GiB|MB|tok/s|GPU-hours|items)\b"
    r"|\d+(?:\.\d+)?%|\d{1,3}(?:,\d{3})+|(?<![\w.])[+-]?\d+\.\d+(?![\w.]*\d)"
)


def _same(said: str, held: str) -> bool:
    """The page's number is its cell's, thousands separators aside."""
    return said.replace(",", "") == held.replace(",", "")


def prose() -> dict[str, str]:
    """Each hand-written page's text, whitespace flattened: the README without its generated section, docs/ but its
    generated pages, notebooks/README.md and each notebook's markdown cells."""
    page = (ROOT / "README.md").read_text()
    texts = {"README.md": page.replace(readme.written(ROOT / "README.md"), "")}
    generated = {ROOT / readme.DETAILS, ROOT / readme.BEYOND}
    texts |= {f"docs/{path.name}": path.read_text() for path in sorted((ROOT / "docs").glob("*.md"))}
    texts = {name: text for name, text in texts.items() if ROOT / name not in generated}
    texts["notebooks/README.md"] = (ROOT / "notebooks" / "README.md").read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        texts[f"notebooks/{path.name}"] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return {name: _flat(text) for name, text in texts.items()}


def unquoted(name: str, text: str) -> list[str]:
    """The quantities on page ``name`` that no ``Quote`` and no ``GIVEN`` of that page covers."""
    covered = [m.span() for q in QUOTES if q.page == name for m in re.finditer(q.said, text)]
    covered += [m.span() for page, words, _ in GIVEN if page == name for m in re.finditer(re.escape(words), text)]
    blank = NOT_QUANTITIES.sub(lambda m: " " * len(m.group(0)), text)  # positions kept
    return [
        m.group(0)
        for m in QUANTITY.finditer(blank)
        if not any(start <= m.start() and m.end() <= end for start, end in covered)
    ]


def test_every_quote_says_what_its_cell_holds():
    """Each quote is on its page once and writes its cell's value: the README's times are CI's last run's, the
    GPU estimate's numbers the estimate's printout, the notebook's 0.12 the recall the code computes."""
    texts = prose()
    for quote in QUOTES:
        said = re.findall(quote.said, texts[quote.page])
        assert len(said) == 1, f"{quote.page}: {quote.said!r} found {len(said)} times"
        assert _same(said[0], quote.quoted()), f"{quote.page} says {said[0]}, its cell holds {quote.quoted()}"


def test_no_number_in_the_prose_is_left_untied():
    """Every quantity that reports a result on a hand-written page is inside a quote of its cell or is given (a
    requirement, an assumption or a setting, with its reason)."""
    left = {name: found for name, text in prose().items() if (found := unquoted(name, text))}
    assert not left
    for page, words, _ in GIVEN:
        assert words in prose()[page], f"{page} no longer says {words!r}: drop it from GIVEN"


@pytest.mark.parametrize(
    ("page", "stale"),
    [
        ("docs/beyond_the_paper.md", "the whitelist restores it (0.93-0.99 at 0.5)"),
        ("docs/tests.md", "`make test` is the whole suite: 463 items"),
        ("docs/tests.md", "| whole suite | `make test` | 406 | 11 min 55 s |"),
        ("docs/gpu.md", "and at most 44 GPU-hours for notebooks 01-07"),
        ("notebooks/README.md", "about 3.4 hours for 00-11 on a 2-core CPU, notebook 12 43 min more"),
        ("docs/gpu.md", "and benign answers 103.8 (25.2% reach their cap of 64-256 tokens)"),
        ("README.md", "`make test` 11 min 55 s"),
    ],
)
def test_a_stale_number_put_back_fails(page, stale):
    """The numbers issue 53 found stale, each put back into its page: the checks above fail on it."""
    texts = prose()
    text = texts.get(page, "") + " " + stale
    quotes_fail = any(
        q.page == page and (len(found := re.findall(q.said, text)) != 1 or not _same(found[0], q.quoted()))
        for q in QUOTES
    )
    assert quotes_fail or unquoted(page, text)


def test_the_readme_quotes_the_latest_measured_ci_run():
    """The CI times the README quotes come from the newest record of a whole CI run (the date its first line opens
    with), never an older one (issue 66: the README quoted a run of an older CI file long after the suite grew; broken
    on purpose: CI_RUN back to ci_run.txt of 2026-12-03 fails here)."""
    runs = sorted(RESULTS.glob("ci_run*.txt"), key=lambda path: path.read_text().split(":")[0].split(",")[0])
    assert CI_RUN == runs[-1], f"the README quotes {CI_RUN.name}; the latest measured run is {runs[-1].name}"
