-- A v1 claim carried over by 20261130000001 was given `replay_attempt_at` = its lease
-- end, a time that never was (and in the future for a lease until 2099). The truth is
-- only that a v1 replay may have been published before the upgrade: the attempt time
-- becomes the upgrade's, when that is earlier, and the history says what happened.
INSERT INTO dead_letter_history (dead_letter_id, operator, action, outcome, detail)
SELECT id, 'dlq migrate', 'migrate', 'uncertain',
       'claimed by a tool older than this schema (dlq v1, lease until '
           || to_char(replay_claim_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
           || '): a replay may have been published before the upgrade, and nobody holds its claim now; check the consumers, then dlq resolve'
FROM dead_letters
WHERE replayed_at IS NULL AND replay_attempt_at IS NOT NULL
  AND right(replay_claim_owner, 40) LIKE ':v1-%';

UPDATE dead_letters SET replay_attempt_at = LEAST(replay_attempt_at, now())
WHERE replayed_at IS NULL AND replay_attempt_at IS NOT NULL
  AND right(replay_claim_owner, 40) LIKE ':v1-%';
