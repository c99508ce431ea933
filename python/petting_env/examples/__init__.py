"""Small example environments; each file also serves itself when run as a script."""
