"""The speculative decoding engine: requests, scheduling, the step loop, metrics."""
