"""How rows are computed, stored, fingerprinted and verified: sweeps, the atlas, the judge, timings."""
