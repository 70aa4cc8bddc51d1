"""The blocking form: Sandbox and its modules."""
