"""Self-distillation data: training prompts that are not evaluation items, and the verifier's
own greedy answers to them (the targets a drafter learns from)."""
