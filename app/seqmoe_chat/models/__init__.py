"""The model manager's logic, without Qt: the catalog and what fits this computer, checks of
hub repositories, downloads in child processes with a persisted queue, the local library and
calibration of the predictor. The widgets live in ``seqmoe_chat.model_manager``."""
