"""The learner: turning a scored batch into new weights.

``step.py`` holds the :class:`~tempering.learner.step.Learner` (epochs, mini-batches, the loss
terms, the KL reference, the critic, off-policy correction); ``plan.py`` decides an update's
passes (rows skipped and merged, micro-batches and their layouts), ``packing.py`` lays rows
out and sizes micro-batches, ``forward.py`` runs the model for log-probs, ``optim.py`` holds
the optimizer and its schedule, ``critic.py`` the value head and its trunk (PPO with GAE), and
``parallel.py`` the data-parallel learners (torchrun: DDP, FSDP2).

Not here: the loss maths (``tempering.algorithms``, plain functions on tensors), advantages
(computed before a batch reaches the learner), sampling (``tempering.rollout``).
"""
