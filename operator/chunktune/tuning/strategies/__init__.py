"""How a study spends its trials: :class:`~.base.Strategy`, the seam, with the all-real strategy
(:mod:`.all_real`) and twin-first (:mod:`.twin_first`: search in a calibrated simulator, confirm
for real; its twin in :mod:`.twin_fit`, :mod:`.twin_points`, :mod:`.twin_report`, and its stored
state in :mod:`.twin_state`).
"""
