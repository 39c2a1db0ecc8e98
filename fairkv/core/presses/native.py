"""The paper's mitigations as kvpress presses a kvpress user composes: ``WhitelistPress`` (Section 5.1, Appendix D)
and ``FairPress`` (Section 5.2, Algorithm 1, Appendices F-G) wrap a kvpress ``ScorerPress``, or each other, the way
kvpress's own wrappers do (``AdaKVPress(SnapKVPress(0.5))``), and take their protected phrases and instruction spans
as text, found in the context the pipeline actually builds (``BoundaryPress``, boundary protection after arXiv
2605.18053, not the paper's, wraps a scorer press alone)::

    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    press = FairPress(WhitelistPress(SnapKVPress(0.5), ["DO NOT DISCLOSE"]), spans=[defense, directive])
    pipe(defense + "\\n" + directive, question="...", press=press)

While the press compresses, a hook on the model's input embeddings reads the context's token ids; their decoded text
is tokenised again with character offsets (it must give back the same ids), every occurrence of a protected phrase
becomes the whitelist, and the spans a partition of the context: each token belongs to the span that holds its last
character, the chat template's header goes to the first span and every token after a span's text to that span (as
``fairkv.core.prompts`` places the paper's spans). The selection is ``RecordingPress``'s (``selection.choose``): the same
kept positions as fairkv's engine for the same tokens, spans and whitelist, recorded in ``kept`` per layer.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence

import torch
from kvpress import BasePress, ScorerPress
from transformers import AutoTokenizer

from fairkv.core.presses import rates
from fairkv.core.presses.recording import RecordingPress
from fairkv.core.presses.registry import REGISTRY, UNREGISTERED, policy_of
from fairkv.core.presses.selection import Marks
from fairkv.core.presses.setting import BOUNDARY_SHARE, Setting, Variant, check_lam, check_share
from fairkv.core.prompts import Span


class NativePressError(ValueError):
    """A protected phrase or a span that the context does not hold, or a press the mitigations cannot wrap."""


@dataclass
class _TextPress(BasePress):
    """What both mitigations share: the wrapped press, the context's ids read at the prefill, and the recorder that
    selects. Each mitigation's last field is ``tokenizer``: the outermost one's places the texts (None: the model's
    own, loaded from its folder or hub id)."""

    press: BasePress
    kept: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.press, (ScorerPress, _TextPress)):
            raise NativePressError(
                f"{type(self.press).__name__} is not a kvpress ScorerPress: the whitelist and fair "
                "eviction rank tokens by a scorer press's scores"
            )
        self._ids: torch.Tensor | None = None
        self._recorder: RecordingPress | None = None
        self._context: tuple[str, list[tuple[int, int]]] | None = None  # the last context's text, each token's range

    def _chain(self) -> tuple[ScorerPress, list["_TextPress"]]:
        """The scorer press at the core and the mitigations around it, outermost first."""
        wrappers, press = [], self
        while isinstance(press, _TextPress):
            wrappers.append(press)
            press = press.press
        return press, wrappers

    @property
    def compression_ratio(self) -> float:
        return self._chain()[0].compression_ratio

    def post_init_from_model(self, model):
        self._chain()[0].post_init_from_model(model)
        if self.tokenizer is None:
            self.tokenizer = AutoTokenizer.from_pretrained(model.config._name_or_path)

    @contextmanager
    def __call__(self, model):
        def read_ids(module, args):
            if self._ids is None:
                self._ids = args[0].detach().cpu()

        self._ids, self._recorder, self._context, self.kept = None, None, None, {}
        hook = model.get_input_embeddings().register_forward_pre_hook(read_ids)
        try:
            with super().__call__(model):
                yield
        finally:
            hook.remove()

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self._recorder is None:
            self._recorder = self._recording(keys.shape[2])
        keys, values = self._recorder.compress(module, hidden_states, keys, values, attentions, kwargs)
        self.kept = self._recorder.kept
        return keys, values

    def _recording(self, n: int) -> RecordingPress:
        """The recorder for this context: the variant, whitelist, spans and lam of every mitigation in the chain."""
        if self._ids is None or self._ids.shape[0] != 1:
            raise NativePressError(
                "the context's token ids were not seen (one context at a time, run through the "
                "press's own context manager, e.g. kvpress's pipeline)"
            )
        self._context = text, offsets = self._offsets(self._ids[0, :n].tolist())
        scorer, wrappers = self._chain()
        window = getattr(scorer, "window_size", None)
        if isinstance(window, int) and n <= window:
            raise NativePressError(
                f"{type(scorer).__name__}'s window of {window} tokens needs a context longer than it, and this one has "
                f"{n} tokens: give a smaller window_size (e.g. {type(scorer).__name__}({scorer.compression_ratio:g}, "
                f"window_size={max(1, n // 4)})) or a longer context"
            )
        boundary = [w for w in wrappers if isinstance(w, BoundaryPress)]
        if boundary and len(wrappers) > 1:
            raise NativePressError(
                "a BoundaryPress composes with no other mitigation: wrap the scorer press in it alone"
            )
        if boundary:
            spans = _partition(text, offsets, boundary[0].spans)
            return RecordingPress(scorer, Setting(None, Variant("boundary"), share=boundary[0].share), Marks(spans))
        phrases = [p for w in wrappers if isinstance(w, WhitelistPress) for p in w.phrases]
        fair = [w for w in wrappers if isinstance(w, FairPress)]
        if len(fair) > 1 or len(wrappers) - len(fair) > 1:
            raise NativePressError("wrap a press in at most one WhitelistPress and one FairPress")
        protected = tuple(sorted({t for phrase in phrases for t in _phrase_tokens(text, offsets, phrase)}))
        spans = _partition(text, offsets, fair[0].spans) if fair else ()
        setting = Setting(None, Variant.of(fair=bool(fair), whitelist=bool(phrases)), fair[0].lam if fair else 1.0)
        return RecordingPress(scorer, setting, Marks(spans, protected))

    def keep_rates(self, texts: Sequence[str] | None = None) -> dict[str, float]:
        """Keep rates in the last context compressed, keyed by text (Section 4's definition,
        ``fairkv.core.presses.rates``): of each of ``texts`` its own tokens (those overlapping its first occurrence
        after the previous text's: a phrase's rate is the phrase's); without ``texts``, of the spans of the
        ``FairPress`` or ``BoundaryPress`` in the chain as it cuts the context (a partition: the chat header counted
        with the first span, what follows a span's text with that span)."""
        if self._context is None:
            raise NativePressError("no context compressed yet: run the press first (e.g. through kvpress's pipeline)")
        text, offsets = self._context
        if texts is not None:
            texts = _texts(texts, "texts")
            if not texts or not all(texts):
                raise NativePressError("keep rates need at least one non-empty text")
            ranges = _placed(text, offsets, texts)
        else:
            own = [w.spans for w in self._chain()[1] if isinstance(w, (FairPress, BoundaryPress))]
            if not own:
                raise NativePressError(
                    "keep rates need texts: pass them, or wrap the press in a FairPress or a BoundaryPress"
                )
            texts, ranges = own[0], _partition(text, offsets, own[0])
        placed = [Span(t, start, end, t) for t, (start, end) in zip(texts, ranges)]
        return rates.keep_rates(self.kept, placed, len(offsets))

    def _offsets(self, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
        """The context's text and each token's character range in it."""
        text = self.tokenizer.decode(ids)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if encoded["input_ids"] != ids:
            raise NativePressError(
                "the context's decoded text does not tokenise back to its ids: text spans and "
                "phrases cannot be placed (pass token positions to fairkv.core.presses.build_press)"
            )
        return text, encoded["offset_mapping"]


def _phrase_tokens(text: str, offsets, phrase: str) -> list[int]:
    """The tokens overlapping any occurrence of ``phrase`` in ``text``."""
    starts, at = [], text.find(phrase)
    while at >= 0:
        starts.append(at)
        at = text.find(phrase, at + 1)
    if not starts:
        raise NativePressError(f"protected phrase {phrase!r} is not in the context")
    return [t for s in starts for t, (a, b) in enumerate(offsets) if a < s + len(phrase) and b > s]


def _found(text: str, spans: Sequence[str]) -> list[int]:
    """Where each span text starts in ``text``, each found after the previous one's end; one found only earlier
    (repeated, overlapping the previous one or out of order) or not at all is an error naming it."""
    marks, at = [], 0
    for span in spans:
        found = text.find(span, at)
        if found < 0:
            if span in text:
                raise NativePressError(
                    f"span {span[:60]!r} is in the context only before the previous span's end: give the spans in "
                    "the context's order, each once, none overlapping another"
                )
            raise NativePressError(f"span {span[:60]!r} is not in the context")
        marks.append(found)
        at = found + len(span)
    return marks


def _placed(text: str, offsets, texts: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """Each text's own token range: the tokens overlapping its occurrence (``_found``)."""
    ranges = []
    for at, part in zip(_found(text, texts), texts):
        inside = [t for t, (a, b) in enumerate(offsets) if a < at + len(part) and b > at]
        ranges.append((inside[0], inside[-1] + 1))
    return tuple(ranges)


def _partition(text: str, offsets, spans: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """Token ranges partitioning the context, one per span text in order: a token belongs to the span that holds its
    last character (the header before the first span to the first, what follows a span's text to that span)."""
    marks = _found(text, spans)
    marks[0] = 0
    owner = [max(k for k, mark in enumerate(marks) if mark <= max(a, b - 1)) for a, b in offsets]
    ranges = []
    for k, span in enumerate(spans):
        members = [t for t, o in enumerate(owner) if o == k]
        if not members:
            raise NativePressError(f"span {span[:60]!r} holds no token of its own")
        ranges.append((members[0], members[-1] + 1))
    return tuple(ranges)


def _texts(value, what: str) -> tuple[str, ...]:
    """``value`` (phrases or span texts) as a tuple of strings; one string is an error, not its characters taken one
    by one, and so is anything but a list of strings (a ``Span`` holds token positions, not a text to find)."""
    if isinstance(value, str):
        raise NativePressError(f"{what} is one string, {value!r}: give a list of texts, [{value!r}]")
    if not isinstance(value, (list, tuple)):
        raise NativePressError(f"{what} is one {type(value).__name__}: give a list of texts{_positions(value)}")
    wrong = next((item for item in value if not isinstance(item, str)), None)
    if wrong is not None:
        raise NativePressError(f"{what} must be texts, not {type(wrong).__name__} {wrong!r}{_positions(wrong)}")
    return tuple(value)


def _positions(item) -> str:
    """What to do with a ``Span`` given where a text belongs ('' for anything else)."""
    if not isinstance(item, Span):
        return ""
    return " (a Span holds token positions: pass its .text, or build the press from positions with fairkv.build_press)"


@dataclass
class WhitelistPress(_TextPress):
    """Section 5.1: every token of every occurrence of ``phrases`` is kept; the wrapped press ranks the rest of the
    budget."""

    phrases: Sequence[str] = ()
    tokenizer: object = None

    def __post_init__(self):
        super().__post_init__()
        self.phrases = _texts(self.phrases, "phrases")
        if not self.phrases or not all(self.phrases):
            raise NativePressError("a WhitelistPress needs at least one non-empty phrase")


@dataclass
class FairPress(_TextPress):
    """Section 5.2 and Appendix G: the context cut into ``spans`` (their texts, in order), each keeping its share of
    the budget (``lam`` = 1: fair eviction; 0: the wrapped press unchanged), ranked inside by span-local scores."""

    spans: Sequence[str] = ()
    lam: float = 1.0
    tokenizer: object = None

    def __post_init__(self):
        super().__post_init__()
        self.spans = _texts(self.spans, "spans")
        check_lam(self.lam)
        if not self.spans or not all(self.spans):
            raise NativePressError("a FairPress needs at least one non-empty span text")
        _check_local(self._chain()[0])


def _check_local(scorer: ScorerPress) -> None:
    """Fair eviction ranks inside each span by span-local scores (Appendix F): a scorer press without them is an error
    naming the presses that have them, and what a press of one's own or one kvpress ships can do instead."""
    policy = policy_of(scorer)
    if policy.local is not None:
        return
    name = type(scorer).__name__
    local = ", ".join(p.name for p in REGISTRY.values() if p.local is not None)
    if policy.scoring == UNREGISTERED:
        instead = "register it with its span-local scoring (fairkv.core.presses.own.register)"
    else:
        instead = f"kvpress's {name} is scored {policy.backend} here; wrap it in a WhitelistPress or a BoundaryPress"
    raise NativePressError(
        f"a FairPress ranks each span by span-local scores (Section 5.2, Appendix F) and {name} has none: {instead}, "
        f"or wrap one of {local}"
    )


@dataclass
class BoundaryPress(_TextPress):
    """Boundary protection (after "Protection Is (Nearly) All You Need", arXiv 2605.18053; not the paper's): the
    context cut into ``spans`` (their texts, in order) as a ``FairPress`` cuts it; ``share`` of the budget is kept at
    each boundary (the context's start, each junction of two spans, its end; ``selection.boundary_positions``) and the
    wrapped press ranks the rest."""

    spans: Sequence[str] = ()
    share: float = BOUNDARY_SHARE
    tokenizer: object = None

    def __post_init__(self):
        super().__post_init__()
        self.spans = _texts(self.spans, "spans")
        check_share(self.share)
        if not self.spans or not all(self.spans):
            raise NativePressError("a BoundaryPress needs at least one non-empty span text")
