"""What a row is made of: data, prompts, models, presses, decoding, scoring (no store, no claim)."""
