"""The engine: the scheduler and its loops (poller, executor, completer, housekeeper, listener,
startup), the history recorder, the observer hooks and the status snapshot."""
