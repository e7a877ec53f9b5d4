"""Rendering: everything here reads records and never touches the profiler's private state."""
