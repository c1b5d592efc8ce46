# deploy/slurm/: the batch job scripts (array, merge, requeue) on a real private one-node
# Slurm (tests/deploy/slurm_cluster.sh): a task SIGKILLed and one cancelled mid-shard are
# requeued, resume, and the merged output matches one `snapserve batch` run outside Slurm.
# Skipped (77) without Slurm/munge, when not root, or without the model.
add_test(NAME test_slurm_batch
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/test_slurm_batch.sh $<TARGET_FILE:snapserve>)
set_tests_properties(test_slurm_batch PROPERTIES LABELS "deploy;slurm" SKIP_RETURN_CODE 77
                     TIMEOUT 900 RESOURCE_LOCK "slurm;cores"
                     ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
# With CUDA, step 6 also runs batch_tp.sbatch with BATCH_DEVICE=cuda on the host twin's snapserve.
if(TARGET snapserve_host_twin)
  set_property(TEST test_slurm_batch APPEND PROPERTY ENVIRONMENT "SNAP_HOST_TWIN_BIN=$<TARGET_FILE:snapserve_host_twin>")
endif()
