-- Argo CD health check of triton-operator.io/TritonService.
--
-- Install it as the argocd-cm key `resource.customizations.health.triton-operator.io_TritonService`
-- (argocd-cm.yaml next to this file carries this exact text). Without it Argo CD has no health for
-- the kind and shows every TritonService Healthy as soon as it exists.
--
--   Progressing  the operator has not observed the current generation yet (no status, or
--                status.observedGeneration < metadata.generation), a rollout is moving
--                (Progressing=True), or the service is not Ready yet for another reason
--   Degraded     the spec was refused (Ready=False, reason InvalidSpec) or something failed
--                (Degraded=True: a rollout rolled back, pods crash-looping, GPU budget too small)
--   Suspended    a rollout is held: paused by spec.rollout.paused or `kubectl triton pause`
--                (Progressing reason RolloutPaused), or at a pause step that waits for
--                `kubectl triton promote` (Progressing=False, reason StepPaused)
--   Healthy      Ready=True for the current generation and nothing of the above
--
-- Only Lua 5.1 base and table functions are used (Argo CD runs gopher-lua in a sandbox).

local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function message(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local status = obj.status
if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the TritonService"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local ready = condition(status, "Ready")
local progressing = condition(status, "Progressing")
local degraded = condition(status, "Degraded")

if ready ~= nil and ready.status == "False" and ready.reason == "InvalidSpec" then
  hs.status = "Degraded"
  hs.message = message(ready, "The spec is invalid")
  return hs
end

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = message(degraded, "Degraded")
  return hs
end

if progressing ~= nil and progressing.status ~= "True" then
  if progressing.reason == "RolloutPaused" or progressing.reason == "StepPaused" then
    hs.status = "Suspended"
    hs.message = message(progressing, "The rollout is paused")
    return hs
  end
end

if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = message(progressing, "Rolling out")
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = message(ready, "Ready")
  return hs
end

hs.status = "Progressing"
hs.message = message(ready, "Waiting for the Ready condition")
return hs
