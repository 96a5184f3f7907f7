"""The Models window: the catalog with what fits this computer, any hub id, downloads and the
local library with calibration. The logic it shows lives in ``seqmoe_chat.models``."""
