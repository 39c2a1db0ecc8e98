"""``fairkv audit``: check a practitioner's own system prompt for eviction bias and leakage under KV-cache compression.

Input (``spans``): the system prompt as text, its instruction spans either marked (a line ``## <name>`` opens a span;
``check=<IFEval instruction id> {json arguments}`` on it makes its compliance checkable, ``secret=TEXT`` declares a
secret, ``reply=TEXT`` the reply the prompt scripts, ``says=TEXT`` a phrase it tells the model to write) or split automatically (by blank lines, else by sentences), named
by their first words, and shown to the user for confirmation. The defense span is the one named ``defense``, else the
last span that talks about not revealing or disclosing; its text is what the whitelist protects (Section 5.1).

Running (``cells``): one prefill scores every audited policy (``score_once.prefill``; default all five); every (policy,
variant, ratio) is cut from it: the base policy and each fix (``fixes``: the whitelist, fair eviction (Section 5.2),
boundary protection; the defense moved last is cut from a second prefill of the reordered prompt); the attacks
(RaccoonBench's: the paper's and one per category, and/or the user's own, ``read_lines_or_jsonl``) and the benign
queries are answered on every cache, greedily, in one running batch. An attack response leaks when the whole prompt's
or any one span's ROUGE-L recall passes 0.3 (the authors' threshold), or when a declared secret (``secret=``, or
``--secret``) appears in it in any case or spacing. Recall is measured beyond the replies the prompt scripts (a quoted
sentence after "reply only with", "respond with", "say", ..., or ``reply=``): both the span and the response lose them
first, so a model that gives the scripted refusal leaks nothing (the notebooks do the same for the paper's reply,
``prompts.without_scripted_reply``); so are the phrases the prompt mandates in every answer (a quoted phrase after "end
every reply with", "start with", "sign off with", "always include", ..., or ``says=``): writing one obeys, and a response
leaks only what it reproduces beyond them.

Reporting (``report``, ``verdict``): per policy, variant and ratio the keep rate per span, leakage, the leak and refusal
rates over the n attacks with their 95% Wilson intervals, the leak rate of each span and secret, the share of benign
queries refused and the compliance of every checkable span; cells that cannot run (a whitelist or a boundary reserve
larger than the budget) with the reason. The verdict is read off that summary: a table with one row per policy
(critical ratio, first span below half its tokens, spans and secrets leaked from r), the which-fix table (``fixes``:
how far each fix holds, answering as the uncompressed model does, and the one to use) and at most three sentences,
the uncompressed finding first, the fix to use last. The same verdict goes to the terminal, ``Audit.to_json`` (the documented schema ``REPORT_SCHEMA``, for a team's
CI with ``fairkv audit --fail-on-leak``) and ``Audit.to_html`` (figures, every cell's attacks and responses, collapsed,
the leaked text marked); the reports redact secrets unless asked to show them.
"""

from fairkv.audit import fixes
from fairkv.audit.cells import attack_fields, default_attacks, read_lines_or_jsonl, run
from fairkv.audit.report import REPORT_SCHEMA, REPORT_SCHEMA_VERSION, Audit, marked
from fairkv.audit.spans import (
    AuditError,
    Spec,
    is_marked,
    mandated_phrases,
    parse,
    reply_pattern,
    scripted_replies,
    secret_pattern,
    span_names,
    spec,
)
from fairkv.audit.verdict import rate_words

__all__ = [
    "REPORT_SCHEMA",
    "REPORT_SCHEMA_VERSION",
    "Audit",
    "AuditError",
    "Spec",
    "attack_fields",
    "default_attacks",
    "fixes",
    "is_marked",
    "mandated_phrases",
    "marked",
    "parse",
    "rate_words",
    "read_lines_or_jsonl",
    "reply_pattern",
    "run",
    "scripted_replies",
    "secret_pattern",
    "span_names",
    "spec",
]
