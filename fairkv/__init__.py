"""fairkv: reproduction of "The Pitfalls of KV Cache Compression" (arXiv 2510.00231).

Four layers, each importing only its own and the earlier ones: ``core`` (what a row is made of: ``data``, ``prompts``,
``models``, ``presses``, ``generation``, ``metrics``, ``score_once``, ``one_prompt``), ``runs`` (how rows are computed,
kept, fingerprinted and verified: ``experiment``, ``store``, ``fingerprint``, ``verify``, the press atlas), ``report``
(what rows say: ``analysis``, ``verdicts``, ``paper``, ``figures``), then ``audit`` and ``cli``.
"""

__version__ = "0.1.0"
