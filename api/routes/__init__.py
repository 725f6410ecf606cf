"""kvscope api/routes."""
