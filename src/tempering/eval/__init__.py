"""Evaluation of a policy on held-out problems.

``greedy.py`` is the accuracy every before/after table is built from; ``sampled.py`` adds
pass@k, maj@k, best-of-k and accuracy by round from n samples per problem; ``stats.py`` holds
the estimators and their confidence intervals.

Not here: building the tasks, rewards and sampler (``tempering.build``) or training.
"""
