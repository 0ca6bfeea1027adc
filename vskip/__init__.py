"""vskip: speculative diffusion decoding with verifier skipping.

The package follows the paper "From Positionwise Confidence to Prefix Scheduling: Verifier
Skipping in Speculative Decoding". Importing it does no work: models load only when asked.
"""

__version__ = "0.1.0"
