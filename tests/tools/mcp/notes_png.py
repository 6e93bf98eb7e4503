"""The 1x1 PNG (base64) that ``notes_server.py``'s ``picture`` tool returns, apart from the
server so that a test can name it without importing the MCP server SDK at collection (0.9 CPU-s
in every xdist worker)."""

PNG_1X1 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
    "AAAABJRU5ErkJggg=="
)
