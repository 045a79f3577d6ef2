"""One-line descriptions of Triton's ModelConfig fields, shown by `kubectl explain` on spec.models[].config.

The protobuf descriptor that tritonclient ships has no comments, so the CRD schema would say
``<no description>`` for every field. These lines say what each field does, in this project's words,
from the facts in Triton's model_config.proto and its model-configuration guide. Keys are protobuf
full names of fields; the fields of synthetic map-entry messages (``key``/``value``) are left out,
since a map appears in the schema as one object described by its own field.
"""

from __future__ import annotations

# Longest description line; `kubectl explain` wraps longer ones, and a line is meant as a summary.
MAX_DESCRIPTION_LENGTH = 150

_MC = "inference.ModelConfig"
_VP = "inference.ModelVersionPolicy"
_IN = "inference.ModelInput"
_OUT = "inference.ModelOutput"
_BI = "inference.BatchInput"
_BO = "inference.BatchOutput"
_OPT = "inference.ModelOptimizationPolicy"
_CUDA = f"{_OPT}.Cuda"
_GS = f"{_CUDA}.GraphSpec"
_ACC = f"{_OPT}.ExecutionAccelerators"
_DB = "inference.ModelDynamicBatching"
_QP = "inference.ModelQueuePolicy"
_SB = "inference.ModelSequenceBatching"
_ENS = "inference.ModelEnsembling"
_IG = "inference.ModelInstanceGroup"
_RL = "inference.ModelRateLimiter"
_WU = "inference.ModelWarmup"
_MET = "inference.ModelMetrics.MetricControl"

FIELD_DESCRIPTIONS: dict[str, str] = {
    # ModelConfig
    f"{_MC}.name": "The model name; left out, it is the model's name in spec.models.",
    f"{_MC}.platform": "Framework of the model: tensorrt_plan, onnxruntime_onnx, pytorch_libtorch, "
    "tensorflow_savedmodel, ensemble, ...",
    f"{_MC}.backend": "Backend that runs the model: python, onnxruntime, tensorrt, pytorch, vllm, ...",
    f"{_MC}.runtime": "Runtime library of the backend (for example model.py for the Python-based backends).",
    f"{_MC}.version_policy": "Which versions of the model are served: latest (the default), all or specific.",
    f"{_MC}.max_batch_size": "Largest batch the model accepts; 0 means the model does not batch and "
    "dims are the full tensor shapes (no leading batch dimension).",
    f"{_MC}.input": "Input tensors of the model; with maxBatchSize > 0 their dims leave out the batch "
    "dimension.",
    f"{_MC}.output": "Output tensors of the model; with maxBatchSize > 0 their dims leave out the batch "
    "dimension.",
    f"{_MC}.batch_input": "Extra inputs the batcher computes from a batch (ragged batching).",
    f"{_MC}.batch_output": "Outputs that come back per request from a ragged batch.",
    f"{_MC}.optimization": "Optimization settings: graph level, CUDA graphs, execution accelerators, ...",
    f"{_MC}.dynamic_batching": "Dynamic batcher: joins independent requests into one batch; needs "
    "maxBatchSize > 0.",
    f"{_MC}.sequence_batching": "Sequence batcher for stateful models: requests with one correlation ID go "
    "to one instance.",
    f"{_MC}.ensemble_scheduling": "Steps of an ensemble (platform: ensemble): which models run and how "
    "tensors flow between them.",
    f"{_MC}.instance_group": "How many instances of the model run, and where (KIND_GPU, KIND_CPU, ...); "
    "left out, one per available GPU.",
    f"{_MC}.default_model_filename": "File name of the model in each version folder, when ccModelFilenames "
    "has no entry for the GPU.",
    f"{_MC}.cc_model_filenames": 'Model file name per CUDA compute capability (key such as "8.0"), inside '
    "the version folder.",
    f"{_MC}.metric_tags": "Extra labels on the model's metrics.",
    f"{_MC}.parameters": 'Backend parameters: {"key": {"stringValue": "value"}}.',
    f"{_MC}.model_warmup": "Requests run when the model loads, before it is marked ready; not for ensembles.",
    f"{_MC}.model_operations": "Custom operation libraries to load with the model.",
    f"{_MC}.model_transaction_policy": "Transaction policy; decoupled: true for models that stream "
    "responses.",
    f"{_MC}.model_repository_agents": "Repository agents that run on the model's files when it loads.",
    f"{_MC}.response_cache": "Response cache of the model; needs a cache in the server (serverArgs).",
    f"{_MC}.model_metrics": "Per-model metric settings (histogram buckets).",
    # ModelVersionPolicy
    f"{_VP}.latest": "Serve the highest-numbered versions only (the default policy).",
    f"{_VP}.all": "Serve every version folder of the model ({}).",
    f"{_VP}.specific": "Serve only the versions listed.",
    f"{_VP}.Latest.num_versions": "How many of the highest-numbered versions are served; default 1.",
    f"{_VP}.Specific.versions": "Version numbers (names of version folders) to serve.",
    # ModelInput
    f"{_IN}.name": "Name of the input tensor, as the client sends it.",
    f"{_IN}.data_type": "Element type of the input tensor (TYPE_FP32, TYPE_INT64, TYPE_STRING, ...).",
    f"{_IN}.format": "Image layout of the input (FORMAT_NHWC or FORMAT_NCHW), which then needs 3 dims; "
    "default FORMAT_NONE.",
    f"{_IN}.dims": "Shape of the input, without the batch dimension when maxBatchSize > 0; -1 marks a "
    "variable-size dimension.",
    f"{_IN}.reshape": "Shape the backend receives instead of dims; must hold the same number of elements.",
    f"{_IN}.is_shape_tensor": "The input is a shape tensor (TensorRT models only).",
    f"{_IN}.allow_ragged_batch": "Requests whose shapes differ in this input may still share a batch; "
    "default false.",
    f"{_IN}.optional": "A request may leave this input out; default false.",
    f"{_IN}.is_non_linear_format_io": "The input uses a non-linear I/O format (TensorRT models only).",
    # ModelOutput
    f"{_OUT}.name": "Name of the output tensor, as the model produces it.",
    f"{_OUT}.data_type": "Element type of the output tensor (TYPE_FP32, TYPE_INT64, TYPE_STRING, ...).",
    f"{_OUT}.dims": "Shape of the output, without the batch dimension when maxBatchSize > 0; -1 marks a "
    "variable-size dimension.",
    f"{_OUT}.reshape": "Shape the backend produces; it is reshaped to dims, with the same number of "
    "elements.",
    f"{_OUT}.label_filename": "File in the model folder with one class label per line, for classification "
    "outputs.",
    f"{_OUT}.is_shape_tensor": "The output is a shape tensor (TensorRT models only).",
    f"{_OUT}.is_non_linear_format_io": "The output uses a non-linear I/O format (TensorRT models only).",
    # ModelTensorReshape
    "inference.ModelTensorReshape.shape": "The shape to use instead; it must hold as many elements as dims.",
    # BatchInput
    f"{_BI}.kind": "What the batcher computes from the source inputs: element counts (plain, accumulated, "
    "max as shape) or item shapes.",
    f"{_BI}.target_name": "Names of the model inputs the batcher fills with the computed value.",
    f"{_BI}.data_type": "Element type of the computed input: TYPE_INT32 or TYPE_FP32.",
    f"{_BI}.source_input": "Names of the model inputs the value is computed from.",
    # BatchOutput
    f"{_BO}.target_name": "Names of the model outputs handled this way.",
    f"{_BO}.kind": "How the output is split back per request: BATCH_SCATTER_WITH_INPUT_SHAPE follows the "
    "source input's shape.",
    f"{_BO}.source_input": "The one input whose shape in each request decides how the output is split back.",
    # ModelOptimizationPolicy
    f"{_OPT}.graph": "Graph optimization of the framework (ONNX Runtime, TensorFlow); left out, the "
    "framework's default.",
    f"{_OPT}.priority": "Scheduling priority against other models: PRIORITY_DEFAULT, PRIORITY_MAX or "
    "PRIORITY_MIN (TensorRT models only).",
    f"{_OPT}.cuda": "CUDA settings: CUDA graphs, busy-waiting on events, a separate output copy stream "
    "(TensorRT backend).",
    f"{_OPT}.execution_accelerators": "Accelerators to run the model with, in order of preference "
    "(ONNX Runtime and TensorFlow backends).",
    f"{_OPT}.input_pinned_memory": "Stage inputs in pinned host memory between system and GPU memory; "
    "on by default.",
    f"{_OPT}.output_pinned_memory": "Stage outputs in pinned host memory between GPU and system memory; "
    "on by default.",
    f"{_OPT}.gather_kernel_buffer_threshold": "Use a gather kernel to collect input buffers when at least "
    "this many; 0 (default) turns it off (TensorRT).",
    f"{_OPT}.eager_batching": "Prepare the next batch while the instance is still busy, at the cost of "
    "smaller batches; default false (TensorRT).",
    f"{_OPT}.Graph.level": "Optimization level: -1 off, 0 the framework default, 1+ higher; ONNX Runtime: "
    "0 all, -1 basic only, 1 basic and extended.",
    f"{_CUDA}.graphs": "Capture the model's work as CUDA graphs and replay them; default false "
    "(TensorRT backend).",
    f"{_CUDA}.busy_wait_events": "Spin on CUDA events for the lowest latency, at the cost of CPU load; "
    "default false (TensorRT backend).",
    f"{_CUDA}.graph_spec": "Batch sizes and input shapes to capture CUDA graphs for; left out with graphs: "
    "true, derived from the model.",
    f"{_CUDA}.output_copy_stream": "Copy outputs to the host on their own CUDA stream; doubles the I/O "
    "buffer memory; default false (TensorRT).",
    f"{_GS}.batch_size": "Batch size the CUDA graph is captured for: 0 when maxBatchSize is 0, else "
    "1..maxBatchSize.",
    f"{_GS}.input": "Shape of each input (by input name, without the batch dimension) the graph is "
    "captured for.",
    f"{_GS}.graph_lower_bound": "Smallest batch size and shapes the graph is also used for; results may "
    "suffer if the model reads padding.",
    f"{_GS}.Shape.dim": "The dimensions of the shape.",
    f"{_GS}.LowerBound.batch_size": "Smallest batch size the graph is used for: 0 when maxBatchSize is 0, "
    "else 1..maxBatchSize.",
    f"{_GS}.LowerBound.input": "Smallest shape of each input (by input name, without the batch dimension) "
    "the graph is used for.",
    f"{_ACC}.gpu_execution_accelerator": "Accelerators for instances on a GPU, first preferred (ONNX "
    "Runtime: tensorrt; TensorFlow: tensorrt, gpu_io, ...).",
    f"{_ACC}.cpu_execution_accelerator": "Accelerators for instances on a CPU, first preferred "
    "(ONNX Runtime: openvino).",
    f"{_ACC}.Accelerator.name": "Name of the accelerator, such as tensorrt or openvino.",
    f"{_ACC}.Accelerator.parameters": "Settings of the accelerator as strings, such as precision_mode: FP16 "
    "for tensorrt; names depend on the backend.",
    f"{_OPT}.PinnedMemoryBuffer.enable": "Use a pinned host buffer for these copies; default true.",
    # ModelDynamicBatching
    f"{_DB}.preferred_batch_size": "Batch sizes run as soon as they can be formed; left out, batches grow "
    "up to maxBatchSize.",
    f"{_DB}.max_queue_delay_microseconds": "How long, in microseconds, a request may wait in the queue for "
    "others to batch with; default 0.",
    f"{_DB}.preserve_ordering": "Return responses in the order requests arrived; default false.",
    f"{_DB}.priority_levels": "Number of request priority levels; 1 is the highest and is served first.",
    f"{_DB}.default_priority_level": "Priority level of requests that set none; between 1 and "
    "priorityLevels.",
    f"{_DB}.default_queue_policy": "Queue policy (timeouts, queue size) for levels with no entry in "
    "priorityQueuePolicy.",
    f"{_DB}.priority_queue_policy": "Queue policy per priority level (the key is the level).",
    # ModelQueuePolicy
    f"{_QP}.timeout_action": "What happens to a request that times out in the queue: REJECT (default) fails "
    "it, DELAY serves it after others.",
    f"{_QP}.default_timeout_microseconds": "Queue timeout of each request, in microseconds; 0 (default) "
    "means no timeout.",
    f"{_QP}.allow_timeout_override": "A request may ask for a shorter timeout than the default; default "
    "false.",
    f"{_QP}.max_queue_size": "Most requests the queue holds; more are refused at once; 0 (default) means "
    "no limit.",
    # ModelSequenceBatching
    f"{_SB}.direct": "Direct strategy (the default): each sequence keeps one batch slot of one instance "
    "until it ends.",
    f"{_SB}.oldest": "Oldest strategy: batches the oldest requests of up to maxCandidateSequences "
    "sequences; slots may change.",
    f"{_SB}.max_sequence_idle_microseconds": "How long, in microseconds, a sequence may have no request "
    "queued before its slot is freed; default 1000000 (1 s).",
    f"{_SB}.control_input": "Model inputs that carry control signals: sequence start, end, ready and "
    "correlation ID.",
    f"{_SB}.state": "Implicit state: an output of one request fed back as an input to the next request of "
    "the sequence.",
    f"{_SB}.iterative_sequence": "Requests run over several iterations, rescheduled by the model until done "
    "(needs backend support); default false.",
    f"{_SB}.StrategyDirect.max_queue_delay_microseconds": "How long, in microseconds, a batch may wait for "
    "more ready slots; used only with minimumSlotUtilization.",
    f"{_SB}.StrategyDirect.minimum_slot_utilization": "Share of slots (0 to 1) that must be ready to run a "
    "batch before the delay ends; default 0 (any one).",
    f"{_SB}.StrategyOldest.max_candidate_sequences": "Most sequences the batcher picks requests from at "
    "once; others wait in a backlog.",
    f"{_SB}.StrategyOldest.preferred_batch_size": "Batch sizes run as soon as they can be formed from "
    "candidate sequences.",
    f"{_SB}.StrategyOldest.max_queue_delay_microseconds": "How long, in microseconds, a request may wait "
    "for others to batch with; default 0.",
    f"{_SB}.StrategyOldest.preserve_ordering": "Return responses in the order requests arrived; default "
    "false; may hold back decoupled models.",
    f"{_SB}.ControlInput.name": "Name of the model input that carries the controls.",
    f"{_SB}.ControlInput.control": "Controls sent through this input.",
    f"{_SB}.Control.kind": "Signal carried: CONTROL_SEQUENCE_START, _END, _READY (data is valid) or _CORRID "
    "(the correlation ID).",
    f"{_SB}.Control.int32_false_true": "Two int32 values for false and true, in that order.",
    f"{_SB}.Control.fp32_false_true": "Two fp32 values for false and true, in that order.",
    f"{_SB}.Control.bool_false_true": "Two bool values for false and true, in that order.",
    f"{_SB}.Control.data_type": "Element type of the correlation ID tensor: TYPE_UINT64, TYPE_INT64, "
    "TYPE_UINT32 or TYPE_INT32.",
    f"{_SB}.State.input_name": "Model input that receives the state at each request.",
    f"{_SB}.State.output_name": "Model output whose value becomes the state for the next request.",
    f"{_SB}.State.data_type": "Element type of the state tensor.",
    f"{_SB}.State.dims": "Shape of the state tensor without the batch dimension.",
    f"{_SB}.State.initial_state": "Value of the state at the start of a sequence; left out, it is undefined.",
    f"{_SB}.State.use_same_buffer_for_input_output": "Keep input and output state in one buffer to save "
    "memory; default false.",
    f"{_SB}.State.use_growable_memory": "Let the state buffer grow in place (CUDA memory; needs "
    "useSameBufferForInputOutput); default false.",
    f"{_SB}.InitialState.data_type": "Element type of the initial state.",
    f"{_SB}.InitialState.dims": "Shape of the initial state without the batch dimension.",
    f"{_SB}.InitialState.zero_data": "Start from zeros (any value turns it on; only setting it counts).",
    f"{_SB}.InitialState.data_file": "File under the model's initial_state folder with the raw initial "
    "data, in row-major order.",
    f"{_SB}.InitialState.name": "Name of this initial state.",
    # ModelEnsembling
    f"{_ENS}.step": "Models the ensemble runs and how their inputs and outputs map to ensemble tensors.",
    f"{_ENS}.max_inflight_requests": "Most requests waiting at each step for the next one, for back-pressure "
    "on fast or decoupled steps; 0 (default) means no limit.",
    f"{_ENS}.Step.model_name": "Model this step runs.",
    f"{_ENS}.Step.model_version": "Version of the model this step runs; -1 means the latest served version.",
    f"{_ENS}.Step.input_map": "Input of the step's model (key) to the ensemble tensor that feeds it (value).",
    f"{_ENS}.Step.output_map": "Output of the step's model (key) to the ensemble tensor it writes (value).",
    f"{_ENS}.Step.model_namespace": "Reserved by Triton for internal use; leave it unset.",
    # ModelInstanceGroup
    f"{_IG}.name": "Name of the group; left out, <model name>_<group number>.",
    f"{_IG}.kind": "Where instances run: KIND_GPU, KIND_CPU, KIND_MODEL (the model decides), KIND_AUTO "
    "(default: GPU if there is one).",
    f"{_IG}.count": "Number of instances: per listed GPU for GPU groups, in total for CPU groups; default 1.",
    f"{_IG}.rate_limiter": "Resources and priority the rate limiter uses for these instances; left out, "
    "no rate limiting.",
    f"{_IG}.gpus": "GPU ids the instances run on (count on each); left out, every GPU the pod has.",
    f"{_IG}.secondary_devices": "Extra devices each instance needs, such as an NVDLA core (TensorRT).",
    f"{_IG}.profile": "TensorRT optimization profiles these instances may use (0-based indexes); left out, "
    "the first.",
    f"{_IG}.passive": "Instances load but get no requests from the scheduler; default false.",
    f"{_IG}.host_policy": "Host policy of the instances; default cpu, model or gpu_<id> after the kind.",
    f"{_IG}.SecondaryDevice.kind": "Kind of the device: KIND_NVDLA (TensorRT backend only).",
    f"{_IG}.SecondaryDevice.device_id": "Id of the secondary device.",
    # ModelRateLimiter
    f"{_RL}.resources": "Named resources an instance must hold to run; it waits until they are free.",
    f"{_RL}.priority": "Weight among instances: priority 2 gets half the turns of priority 1; default 1 "
    "(0 counts as 1).",
    f"{_RL}.Resource.name": "Name of the resource.",
    f"{_RL}.Resource.global": "The resource is shared by all devices instead of counted per device; "
    "default false.",
    f"{_RL}.Resource.count": "How many units of the resource one execution needs.",
    # ModelParameter
    "inference.ModelParameter.string_value": "Value of the parameter, always a string.",
    # ModelWarmup
    f"{_WU}.name": "Name of this warmup sample.",
    f"{_WU}.batch_size": "Batch size of the warmup request, at least 1 (exactly 1 for models that do not "
    "batch).",
    f"{_WU}.inputs": "Data for each model input (by name), control inputs included.",
    f"{_WU}.count": "How many times the sample runs; 0 (default) runs it once.",
    f"{_WU}.Input.data_type": "Element type of the warmup input.",
    f"{_WU}.Input.dims": "Shape of the warmup input without the batch dimension.",
    f"{_WU}.Input.zero_data": "Fill the input with zeros (any value turns it on; only setting it counts).",
    f"{_WU}.Input.random_data": "Fill the input with random data (zeros for TYPE_STRING); only setting it "
    "counts.",
    f"{_WU}.Input.input_data_file": "File under the model's warmup folder with the raw input data, in "
    "row-major order.",
    # ModelOperations
    "inference.ModelOperations.op_library_filename": "Paths of libraries with custom operations to load "
    "(ONNX models only).",
    # ModelTransactionPolicy
    "inference.ModelTransactionPolicy.decoupled": "The model may send any number of responses per request, "
    "in any order; default false (exactly one).",
    # ModelRepositoryAgents
    "inference.ModelRepositoryAgents.agents": "Agents run in this order on the model's repository actions "
    "(load, unload).",
    "inference.ModelRepositoryAgents.Agent.name": "Name of the repository agent.",
    "inference.ModelRepositoryAgents.Agent.parameters": "Settings of the agent as strings.",
    # ModelResponseCache
    "inference.ModelResponseCache.enable": "Answer repeated identical requests from the cache; default "
    "false.",
    # ModelMetrics
    "inference.ModelMetrics.metric_control": "Metric families whose settings are overridden for this model.",
    f"{_MET}.metric_identifier": "Which metric family the override applies to.",
    f"{_MET}.histogram_options": "Histogram settings of the family.",
    f"{_MET}.MetricIdentifier.family": "Name of the metric family; any of Triton's histogram metrics.",
    f"{_MET}.HistogramOptions.buckets": "Upper bounds of the histogram buckets, in ascending order.",
}
