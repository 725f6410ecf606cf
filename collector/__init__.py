"""kvscope collector: vendor expositions -> canonical signals -> windows -> SQL store."""
