"""Pure helpers shared by both controllers: conditions, Events, time."""
