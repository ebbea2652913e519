-- Argo CD health of a torchjob.io TorchJob, from the status the operator writes.
-- Progressing: not yet observed, waiting for pods, starting or restarting after a failure.
-- Healthy: training (Ready=True) or succeeded. Suspended: spec.runPolicy.suspend.
-- Degraded: failed for good, or stalled (Stalled=True: an invalid spec, pods that cannot be
-- created). Install: docs/fits-your-cluster.md.
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
  hs.message = "Waiting for the operator to observe the TorchJob"
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
  hs.message = say(stalled or condition(status, "Failed"), "Failed")
  return hs
end
if status.phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = say(condition(status, "Suspended"), "Suspended")
  return hs
end
local ready = condition(status, "Ready")
if status.phase == "Succeeded" or (status.phase == "Running" and ready ~= nil and ready.status == "True") then
  hs.status = "Healthy"
  hs.message = say(ready, status.phase)
  return hs
end
hs.status = "Progressing"
hs.message = say(ready, status.phase)
return hs
