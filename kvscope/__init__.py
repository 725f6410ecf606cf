"""kvscope composition root: settings, CLI, demo. Holds no domain logic; nothing imports it."""
