//! The store's operations on a session, each one round trip (a Lua script where it reads and
//! writes, so that no other client's command runs between the two).

use redis::Script;
use redis::aio::ConnectionManager;
use std::time::Duration;
use uuid::Uuid;

/// The keys' common prefix.
const PREFIX: &str = "rp";

/// The store could not be reached or answered something else than expected.
#[derive(Debug, thiserror::Error)]
#[error("session store: {0}")]
pub struct StoreError(String);

impl From<redis::RedisError> for StoreError {
    fn from(error: redis::RedisError) -> Self {
        StoreError(error.to_string())
    }
}

/// A session held by this replica until the lease runs out or is released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lease {
    /// The session.
    pub id: Uuid,
    /// The fencing token: larger than any handed out for the session before.
    pub token: u64,
    /// What the lease key holds: `holder:token`.
    value: String,
}

/// What asking for a session's lease gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// The lease, and how many entries the session has.
    Held(Lease, u64),
    /// Another replica holds it, for at most this long.
    Busy(Duration),
    /// The store has no such session.
    Missing,
}

/// What appending a change gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Appended {
    /// Appended: the session now has this many entries.
    At(u64),
    /// The lease is no longer this one (it ran out and another replica may hold it): nothing
    /// was written.
    Fenced,
    /// The session has this many entries, not the number expected: nothing was written.
    Moved(u64),
}

/// A connection to the store, for one replica (`holder` names it in the leases it takes).
#[derive(Clone)]
pub(crate) struct Store {
    connection: ConnectionManager,
    holder: String,
    /// How long a session no replica changes is kept (`--session-ttl`), in milliseconds (0:
    /// for ever).
    expiry_ms: u64,
    scripts: std::sync::Arc<Scripts>,
}

/// The scripts, each hashed once (they run by hash, and are sent whole once per server).
struct Scripts {
    create: Script,
    acquire: Script,
    renew: Script,
    release: Script,
    append: Script,
    delete: Script,
    report: Script,
    reports: Script,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("holder", &self.holder)
            .finish()
    }
}

fn key(id: Uuid, what: &str) -> String {
    format!("{PREFIX}:{{{id}}}:{what}")
}

fn index() -> String {
    format!("{PREFIX}:sessions")
}

fn control_key() -> String {
    format!("{PREFIX}:control")
}

fn replicas_key() -> String {
    format!("{PREFIX}:replicas")
}

/// KEYS: log, index. ARGV: id, created_at, entry, expiry_ms (0: none). 1 when created, 0 when
/// the id was taken.
const CREATE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[3])
if ARGV[4] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1";

/// KEYS: log, lease, fence, images. ARGV: holder, ttl_ms, expiry_ms (0: none). {token, length} when
/// held (a lease the holder itself still has is taken over: its turns take turns already);
/// {0, pttl} when another holds it; {-1, 0} when there is no such session.
const ACQUIRE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
local held = redis.call('GET', KEYS[2])
if held and string.sub(held, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. ':' then
  return {0, redis.call('PTTL', KEYS[2])}
end
local token = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[2], ARGV[1] .. ':' .. token, 'PX', ARGV[2])
if ARGV[3] ~= '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
end
return {token, redis.call('LLEN', KEYS[1])}";

/// KEYS: lease. ARGV: value, ttl_ms. 1 when the lease was still this one and runs `ttl_ms`
/// from now, 0 when it was not.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])";

/// KEYS: lease. ARGV: value. 1 when it was held and is released, 0 when not held.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])";

/// KEYS: lease, log, images. ARGV: value, expected length, entry, expiry_ms (0: none), then
/// (sha256, bytes) of each image the entry adds. {1, length} when appended (the images kept
/// with it), {0, 0} when the lease is not held, {-1, length} when the length is not the
/// expected one (nothing written then).
const APPEND: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0, 0} end
local length = redis.call('LLEN', KEYS[2])
if length ~= tonumber(ARGV[2]) then return {-1, length} end
length = redis.call('RPUSH', KEYS[2], ARGV[3])
for i = 5, #ARGV, 2 do redis.call('HSETNX', KEYS[3], ARGV[i], ARGV[i + 1]) end
if ARGV[4] ~= '0' then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
end
return {1, length}";

/// KEYS: replicas. ARGV: holder, report. The report, stamped with the store's clock (so that
/// replicas' clocks need not agree).
const REPORT: &str = r"
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ms .. ' ' .. ARGV[2])
return 1";

/// KEYS: replicas. ARGV: life_ms. The reports made within `life_ms`; reports ten times older
/// (replicas long gone) are dropped.
const REPORTS: &str = r"
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
local life = tonumber(ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #all, 2 do
  local value = all[i + 1]
  local space = string.find(value, ' ')
  local age = ms - tonumber(string.sub(value, 1, space - 1))
  if age <= life then
    table.insert(live, string.sub(value, space + 1))
  elseif age > 10 * life then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return live";

/// KEYS: log, lease, fence, images, index. ARGV: id. 1 when this call deleted the session.
const DELETE: &str = r"
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return redis.call('ZREM', KEYS[5], ARGV[1])";

impl Store {
    /// Connects to the store at `url` (`redis://host:port/db`); the connection reconnects by
    /// itself after a failure. A session no replica changes for `expiry` is dropped by the
    /// store itself.
    pub async fn connect(
        url: &str,
        holder: &str,
        expiry: Option<Duration>,
    ) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(2);
        let connection = client.get_connection_manager_with_config(config).await?;
        let scripts = Scripts {
            create: Script::new(CREATE),
            acquire: Script::new(ACQUIRE),
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
            append: Script::new(APPEND),
            delete: Script::new(DELETE),
            report: Script::new(REPORT),
            reports: Script::new(REPORTS),
        };
        Ok(Self {
            connection,
            holder: holder.to_string(),
            expiry_ms: expiry.map_or(0, |e| e.as_millis().max(1) as u64),
            scripts: std::sync::Arc::new(scripts),
        })
    }

    /// Records a new session whose first entry is `entry`; `false` when `id` is taken.
    pub async fn create(
        &self,
        id: Uuid,
        created_at: f64,
        entry: &[u8],
    ) -> Result<bool, StoreError> {
        let created: i64 = self
            .scripts
            .create
            .key(key(id, "log"))
            .key(index())
            .arg(id.to_string())
            .arg(created_at)
            .arg(entry)
            .arg(self.expiry_ms)
            .invoke_async(&mut self.connection.clone())
            .await?;
        Ok(created == 1)
    }

    /// Asks for `id`'s lease, for `ttl` unless renewed.
    pub async fn acquire(&self, id: Uuid, ttl: Duration) -> Result<Acquired, StoreError> {
        let (first, second): (i64, i64) = self
            .scripts
            .acquire
            .key(key(id, "log"))
            .key(key(id, "lease"))
            .key(key(id, "fence"))
            .key(key(id, "images"))
            .arg(&self.holder)
            .arg(ttl.as_millis() as u64)
            .arg(self.expiry_ms)
            .invoke_async(&mut self.connection.clone())
            .await?;
        Ok(match first {
            -1 => Acquired::Missing,
            0 => Acquired::Busy(Duration::from_millis(second.max(0) as u64)),
            token => {
                let token = token as u64;
                let value = format!("{}:{token}", self.holder);
                Acquired::Held(Lease { id, token, value }, second as u64)
            }
        })
    }

    /// Keeps `lease` for `ttl` from now; `false` when it was no longer held.
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, StoreError> {
        let renewed: i64 = self
            .scripts
            .renew
            .key(key(lease.id, "lease"))
            .arg(&lease.value)
            .arg(ttl.as_millis() as u64)
            .invoke_async(&mut self.connection.clone())
            .await?;
        Ok(renewed == 1)
    }

    /// Gives `lease` up; `false` when it was no longer held.
    pub async fn release(&self, lease: &Lease) -> Result<bool, StoreError> {
        let released: i64 = self
            .scripts
            .release
            .key(key(lease.id, "lease"))
            .arg(&lease.value)
            .invoke_async(&mut self.connection.clone())
            .await?;
        Ok(released == 1)
    }

    /// Appends `entry` to the session of `lease`, if the lease still holds and the session
    /// has `expected` entries.
    pub async fn append(
        &self,
        lease: &Lease,
        expected: u64,
        entry: &[u8],
        images: &[(&str, &[u8])],
    ) -> Result<Appended, StoreError> {
        let mut script = self.scripts.append.prepare_invoke();
        script
            .key(key(lease.id, "lease"))
            .key(key(lease.id, "log"))
            .key(key(lease.id, "images"))
            .arg(&lease.value)
            .arg(expected)
            .arg(entry)
            .arg(self.expiry_ms);
        for (sha256, bytes) in images {
            script.arg(*sha256).arg(*bytes);
        }
        let (outcome, length): (i64, i64) =
            script.invoke_async(&mut self.connection.clone()).await?;
        Ok(match outcome {
            1 => Appended::At(length as u64),
            0 => Appended::Fenced,
            _ => Appended::Moved(length as u64),
        })
    }

    /// The session's entries from the `from`th on; `None` when the store has no such session.
    pub async fn entries(&self, id: Uuid, from: u64) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let mut connection = self.connection.clone();
        let (exists, entries): (i64, Vec<Vec<u8>>) = redis::pipe()
            .atomic()
            .cmd("EXISTS")
            .arg(key(id, "log"))
            .cmd("LRANGE")
            .arg(key(id, "log"))
            .arg(from)
            .arg(-1)
            .query_async(&mut connection)
            .await?;
        Ok((exists == 1).then_some(entries))
    }

    /// Deletes the session; `true` for the one call, fleet-wide, that deleted it.
    pub async fn delete(&self, id: Uuid) -> Result<bool, StoreError> {
        let deleted: i64 = self
            .scripts
            .delete
            .key(key(id, "log"))
            .key(key(id, "lease"))
            .key(key(id, "fence"))
            .key(key(id, "images"))
            .key(index())
            .arg(id.to_string())
            .invoke_async(&mut self.connection.clone())
            .await?;
        Ok(deleted == 1)
    }

    /// The bytes of image `sha256` of session `id`, when kept.
    pub async fn image(&self, id: Uuid, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let bytes: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(key(id, "images"))
            .arg(sha256)
            .query_async(&mut self.connection.clone())
            .await?;
        Ok(bytes)
    }

    /// Every session, with its creation time (seconds since the epoch), oldest first.
    pub async fn sessions(&self) -> Result<Vec<(Uuid, f64)>, StoreError> {
        let listed: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(index())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut self.connection.clone())
            .await?;
        Ok(listed
            .into_iter()
            .filter_map(|(id, at)| Some((Uuid::parse_str(&id).ok()?, at)))
            .collect())
    }

    /// Sets (or, with `None`, removes) one field of the fleet's control.
    pub async fn set_control(&self, field: &str, value: Option<&str>) -> Result<(), StoreError> {
        let command = match value {
            Some(value) => redis::cmd("HSET")
                .arg(control_key())
                .arg(field)
                .arg(value)
                .to_owned(),
            None => redis::cmd("HDEL").arg(control_key()).arg(field).to_owned(),
        };
        let _: i64 = command.query_async(&mut self.connection.clone()).await?;
        Ok(())
    }

    /// The fleet's control: the pause in force and the weight version, as kept.
    pub async fn control(&self) -> Result<(Option<String>, Option<String>), StoreError> {
        Ok(redis::cmd("HMGET")
            .arg(control_key())
            .arg("pause")
            .arg("weight_version")
            .query_async(&mut self.connection.clone())
            .await?)
    }

    /// Keeps this replica's `report`, stamped with the store's time.
    pub async fn report(&self, report: &str) -> Result<(), StoreError> {
        let _: i64 = self
            .scripts
            .report
            .key(replicas_key())
            .arg(&self.holder)
            .arg(report)
            .invoke_async(&mut self.connection.clone())
            .await?;
        Ok(())
    }

    /// Every replica's report made within `life`.
    pub async fn reports(&self, life: Duration) -> Result<Vec<String>, StoreError> {
        Ok(self
            .scripts
            .reports
            .key(replicas_key())
            .arg(life.as_millis() as u64)
            .invoke_async(&mut self.connection.clone())
            .await?)
    }
}

#[cfg(test)]
mod tests;
