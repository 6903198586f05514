"""Examples that extend verl (custom tools) for use with verl-launch recipes."""
