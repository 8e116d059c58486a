"""tempering: reinforcement-learning post-training with verifiable rewards.

The folders follow one RL step: ``rollout`` samples, ``rewards`` scores (``envs`` plays
multi-turn episodes, ``tasks`` supplies problems and names their rewards), ``learner`` turns a
scored batch into new weights; ``eval`` and ``reporting`` stand beside the loop, and
``algorithms`` (maths on tensors), ``models`` and ``sandbox`` below it. At the top are the
commands (``train``, ``sft``, ``pretrain``, ``rm``, ``eval_model``, ``serve_model``,
``explain``; ``cli`` parses their arguments), the one builder from config to objects
(``build``), what joins the parts of a run (``scheduler``, ``pipeline``, ``placement``,
``checkpoint``) and the foundations every part may use (``config``, ``types``, ``registry``,
``faults``, ``threads``). Imports run only down that order, which ``tests/unit/test_layers.py``
checks; this package itself imports nothing, so ``import tempering`` is cheap.
"""

__version__ = "0.1.0"
