"""What rows say: statistics, the paper's claims and verdicts, figures, the README's section."""
