"""The top floor: the live demo, its chart and its scripted producer, wiring the emitter
and the Spark consumer together. Neither side imports it."""
