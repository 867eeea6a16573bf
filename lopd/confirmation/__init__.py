"""The confirmatory run: the pilot's verdict retested where the search cannot steer it.

The final runs on ``data/splits/test.jsonl`` are the *pilot* (exploratory). The confirmation has its own
test split (:mod:`~lopd.confirmation.split`, drawn content- and solution-disjoint from train, val and the
pilot's test, sealed to the ``confirm_evaluate`` stage), a registration written before that split is read
(:mod:`~lopd.confirmation.registration`: the rule, the set S of points the search cannot tell apart, the
arms, the fresh seeds, the smallest effect of interest, the design sized by the pilot), and the amended rule
evaluated at every point of S (:mod:`lopd.analysis.confirmation`).
"""
