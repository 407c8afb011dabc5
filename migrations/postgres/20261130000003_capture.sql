-- `dlq capture`: what identifies a message taken from a RabbitMQ queue, so that a
-- redelivery (after a crash, a lost connection or a lost commit) never makes a second row.
-- See docs/capture.md. Not unique: two identical but distinct messages share a key, and
-- both get a row. Claims and marks never change it, so they stay HOT updates.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS capture_key TEXT NULL;
CREATE INDEX IF NOT EXISTS dead_letters_capture_key_idx
    ON dead_letters (capture_key) WHERE capture_key IS NOT NULL;
