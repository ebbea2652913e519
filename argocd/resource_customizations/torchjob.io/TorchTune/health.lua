-- Argo CD health of a torchjob.io TorchTune (a tuning study), from the status the operator writes.
-- Progressing: not yet observed (no phase, or status.observedGeneration behind
-- metadata.generation).
-- Healthy: trials running (phase Running, as a TorchJob that trains is Healthy) or succeeded.
-- Degraded: failed for good (phase Failed or Stalled=True: an invalid spec, more failed trials
-- than spec.maxFailedTrials, spec.activeDeadlineSeconds passed).
-- A study has no suspend. Install: docs/fits-your-cluster.md.
local hs = {}
local function condition(status, type_)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end
local function say(c, fallback)
  if c == nil then
    return fallback
  end
  if c.reason ~= nil and c.reason ~= "" and c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.message or c.reason or fallback
end

local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the TorchTune"
  return hs
end
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end
local stalled = condition(status, "Stalled")
if status.phase == "Failed" or (stalled ~= nil and stalled.status == "True") then
  hs.status = "Degraded"
  if stalled ~= nil and stalled.status == "True" then
    hs.message = say(stalled, "Failed")
  else
    hs.message = say(condition(status, "Failed"), "Failed")
  end
  return hs
end
if status.phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = say(condition(status, "Complete") or condition(status, "Ready"), "Succeeded")
  return hs
end
if status.phase == "Running" then
  hs.status = "Healthy"
  local progress = "Running"
  if status.progress ~= nil then
    progress = "Running: " .. status.progress .. " trials finished"
  end
  hs.message = say(condition(status, "Ready"), progress)
  return hs
end
hs.status = "Progressing"
hs.message = say(condition(status, "Ready"), status.phase)
return hs
