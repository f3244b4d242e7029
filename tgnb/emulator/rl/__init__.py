"""The emulator's Post-Training side (``/v1/rl/...``): served by the daemon, never imported by
``%load_ext tgnb``. Engine (compute): catalog, engine, losses, sampling, checkpoints. Server:
app (routes), state (records + files), operations (FIFO, idempotency, workers), lifecycle."""
