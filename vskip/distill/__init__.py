"""Self-distillation data: training prompts that are not evaluation items, and the verifier's
own greedy answers to them (the targets a drafter learns from)."""

from vskip.distill.prompts import TrainPrompt, build_prompts, load_prompts

__all__ = ["TrainPrompt", "build_prompts", "load_prompts"]
