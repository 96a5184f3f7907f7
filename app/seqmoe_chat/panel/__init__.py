"""The live SeqMoE panel: memory, the expert cache map, predicted against routed experts,
stalls and counters, sampled from the engine's event stream off the generation path.

``telemetry_model`` and ``memory_monitor`` hold no Qt; the other modules are its views."""
