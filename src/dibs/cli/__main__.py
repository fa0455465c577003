"""``python -m dibs.cli`` runs the dibs command."""

from dibs.cli import main

main()
