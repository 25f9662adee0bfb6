"""The CLI's commands and the documents they print."""
