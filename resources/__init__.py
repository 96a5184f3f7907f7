"""The files shipped with SeqMoE (the demo model, its predictor, calibration text, icons, the
model catalog), installed as the package ``seqmoe_resources``; ``seqmoe.resources`` finds them."""
