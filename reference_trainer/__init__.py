"""The bundled reference FSDP2 trainer that faultlab experiments run against by default."""
