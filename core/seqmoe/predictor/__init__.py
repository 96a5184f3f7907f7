"""The SeqMoE predictor: model, training, evaluation against baselines, and calibration."""

from .model import ExpertPredictor, PredictorConfig, load_predictor, save_predictor

__all__ = ["ExpertPredictor", "PredictorConfig", "load_predictor", "save_predictor"]
