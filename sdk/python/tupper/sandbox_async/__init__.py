"""The asyncio form: AsyncSandbox and its modules."""
